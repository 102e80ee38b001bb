// A CPU LayerContext for building single layers in tests: F32 weights and activations, one rank
// (or the rank given), with the cache spec lists and the communicator it points to kept beside it.
#pragma once

#include <vector>

#include "dist/communicator.h"
#include "layers/context.h"

namespace atom::test {

struct TestLayerContext {
  std::vector<CacheSpec> caches;
  std::vector<StateCacheSpec> states;
  SoloCommunicator solo;
  LayerContext ctx;

  explicit TestLayerContext(ParamRegistry& params, int tp_rank = 0, int tp_size = 1)
      : ctx{params,  Device::cpu(), DType::kF32, DType::kF32, tp_rank, tp_size, &solo,
            &caches, &states,       false,       nullptr,     {},      false} {}
  TestLayerContext(const TestLayerContext&) = delete;
  TestLayerContext& operator=(const TestLayerContext&) = delete;
};

}  // namespace atom::test
