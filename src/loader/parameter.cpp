#include "loader/parameter.h"

#include "core/convert.h"
#include "core/error.h"

namespace atom {

Parameter::Parameter(std::string name, Tensor data, WeightLoader loader,
                     std::vector<std::string> expected_parts)
    : name_(std::move(name)),
      data_(std::move(data)),
      loader_(std::move(loader)),
      expected_(std::move(expected_parts)) {}

std::string Parameter::part_key(const std::string& shard, int expert) {
  return expert >= 0 ? fmt::format("expert {}/{}", expert, shard) : shard;
}

void Parameter::record_part(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!received_.insert(key).second)
    fail("parameter '{}' received {} twice (duplicate checkpoint tensor)", name_,
         key.empty() ? "its data" : "part '" + key + "'");
}

void Parameter::load(const Tensor& ckpt, const std::string& shard, int expert) {
  record_part(part_key(shard, expert));
  loader_(*this, ckpt, shard, expert);
}

std::vector<std::string> Parameter::missing_parts() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> r;
  for (const auto& e : expected_)
    if (!received_.count(e)) r.push_back(e);
  return r;
}

bool Parameter::received_nothing() const {
  std::lock_guard<std::mutex> lock(mu_);
  return received_.empty();
}

void param_check_shape(const Parameter& p, const Tensor& ckpt, const Shape& shape,
                       const std::string& what) {
  if (ckpt.shape() != shape)
    fail("checkpoint tensor for '{}'{} has shape {}, expected {}", p.name(), what,
         shape_str(ckpt.shape()), shape_str(shape));
}

WeightLoader default_weight_loader() {
  return [](Parameter& p, const Tensor& ckpt, const std::string&, int) {
    param_check_shape(p, ckpt, p.data().shape(), "");
    tensor_assign(p.data(), ckpt);
  };
}

Parameter& ParamRegistry::add(const std::string& name, Tensor data, WeightLoader loader,
                              std::vector<std::string> expected_parts) {
  ATOM_CHECK(!params_.count(name), "parameter '{}' registered twice", name);
  auto p = std::make_unique<Parameter>(name, std::move(data), std::move(loader),
                                       std::move(expected_parts));
  Parameter& ref = *p;
  params_[name] = std::move(p);
  return ref;
}

Parameter* ParamRegistry::find(const std::string& name) {
  auto it = params_.find(name);
  return it == params_.end() ? nullptr : it->second.get();
}

bool ParamRegistry::in_missing_module(const std::string& name) const {
  for (const std::string& m : missing_)
    if (name.starts_with(m)) return true;
  return false;
}

void ParamRegistry::run_post_load() {
  for (auto& fn : post_load_) fn();
}

}  // namespace atom
