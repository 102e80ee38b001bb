// The speculative-decoding series of /metrics, with vLLM's names: absent until the engine
// speculates, then the totals and one accepted-token counter per draft position.
#include <gtest/gtest.h>

#include "server/metrics.h"

namespace atom::server {
namespace {

TEST(SpecMetrics, RenderedWithVllmNamesOnceSet) {
  Metrics m("tiny");
  EXPECT_EQ(m.render().find("spec_decode"), std::string::npos);
  m.set_spec_decode(10, 30, 17, {8, 6, 3});
  const std::string r = m.render();
  const std::string base = "{engine=\"0\",model_name=\"tiny\"";
  for (const std::string& line :
       {"vllm:spec_decode_num_drafts_total" + base + "} 10",
        "vllm:spec_decode_num_draft_tokens_total" + base + "} 30",
        "vllm:spec_decode_num_accepted_tokens_total" + base + "} 17",
        "vllm:spec_decode_num_accepted_tokens_per_pos_total" + base + ",position=\"0\"} 8",
        "vllm:spec_decode_num_accepted_tokens_per_pos_total" + base + ",position=\"2\"} 3",
        std::string("# TYPE vllm:spec_decode_num_drafts_total counter")})
    EXPECT_NE(r.find(line + "\n"), std::string::npos) << line << "\nin:\n" << r;
  EXPECT_EQ(r.find("position=\"3\""), std::string::npos);
}

}  // namespace
}  // namespace atom::server
