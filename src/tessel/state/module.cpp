#include "tessel/state/module.h"

#include <fmt/format.h>

#include "tessel/core/error.h"

namespace tessel {
namespace {

void check_path_name(const std::string& name, std::string_view what) {
  if (name.empty() || name.front() == '/' || name.back() == '/' || name.find("//") != std::string::npos)
    throw ValueError(fmt::format("invalid {} name '{}': segments must be non-empty, joined by '/'", what, name));
}

}  // namespace

Module::Module(std::string name) : name_(std::move(name)) { check_path_name(name_, "module"); }

void Module::check_new_name(const std::string& name) const {
  for (const ParamDecl& p : params_)
    if (p.name == name) throw ValueError(fmt::format("module '{}' already has a parameter '{}'", name_, name));
  for (const Module& m : children_)
    if (m.name_ == name) throw ValueError(fmt::format("module '{}' already has a submodule '{}'", name_, name));
}

Module& Module::param(ParamDecl decl) {
  check_path_name(decl.name, "parameter");
  check_new_name(decl.name);
  const std::string where = fmt::format("{}/{}", name_, decl.name);
  if (decl.kind.empty()) throw ValueError(fmt::format("{}: empty variable kind", where));
  const Partitioning& p = decl.partitioning;
  if (!p.logical.empty() && p.mesh_axes)
    throw ValueError(fmt::format("{}: give logical axes or mesh axes, not both", where));
  if (!p.logical.empty() && p.logical.size() != decl.shape.rank())
    throw ValueError(fmt::format("{}: {} logical axis names for shape {}", where, p.logical.size(),
                                 decl.shape.to_string()));
  if (p.mesh_axes && p.mesh_axes->size() > decl.shape.rank())
    throw ValueError(fmt::format("{}: mesh axes {} do not fit shape {}", where, p.mesh_axes->to_string(),
                                 decl.shape.to_string()));
  int64_t bytes = 0;  // num_elements() throws on overflow itself
  if (__builtin_mul_overflow(decl.shape.num_elements(), static_cast<int64_t>(item_size(decl.dtype)), &bytes))
    throw ValueError(fmt::format("{}: {} of shape {} has more than 2^63 bytes", where, tessel::name(decl.dtype),
                                 decl.shape.to_string()));
  compute_fans(decl.shape, decl.fans);  // checks the fan axes
  params_.push_back(std::move(decl));
  return *this;
}

Module& Module::add(Module child) {
  check_new_name(child.name_);
  children_.push_back(std::move(child));
  return *this;
}

void Module::visit_from(const std::string& prefix,
                        const std::function<void(const std::string&, const ParamDecl&)>& fn) const {
  for (const ParamDecl& p : params_) fn(prefix.empty() ? p.name : prefix + "/" + p.name, p);
  for (const Module& m : children_) m.visit_from(prefix.empty() ? m.name_ : prefix + "/" + m.name_, fn);
}

void Module::visit(const std::function<void(const std::string& path, const ParamDecl& decl)>& fn,
                   bool include_root) const {
  visit_from(include_root ? name_ : std::string(), fn);
}

size_t Module::num_params() const {
  size_t n = params_.size();
  for (const Module& m : children_) n += m.num_params();
  return n;
}

}  // namespace tessel
