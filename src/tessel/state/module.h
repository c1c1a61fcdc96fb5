// A Module declares parameters (shape, dtype, initializer, logical axes, fans) and nests
// submodules; each parameter's path is the '/'-joined names from the root. Declaring allocates
// nothing: init() and eval_shape() walk the same declarations, so the abstract state and the
// initialized one cannot disagree.
//
//   tessel::Module mlp("mlp");
//   mlp.param({.name = "wi/kernel", .shape = {512, 2048}, .init = tessel::Initializer::lecun_normal(),
//              .partitioning = {.logical = {"embed", "mlp"}}, .fans = {{0}, {1}}});
//   tessel::Module model("model");     // the root's name is not part of paths
//   model.add(std::move(mlp));           // mlp/wi/kernel
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "tessel/core/dtype.h"
#include "tessel/core/shape.h"
#include "tessel/state/initializer.h"
#include "tessel/state/variable.h"

namespace tessel {

struct ParamDecl {
  std::string name;  // may hold '/' for a short chain ("wi/kernel")
  Shape shape;
  DType dtype = DType::kF32;
  Initializer init = Initializer::zeros();
  Partitioning partitioning;
  Fans fans;                  // for variance scaling; default: in = dim -2, out = dim -1
  std::string kind = kParam;
};

class Module {
 public:
  // Throws ValueError on an empty name or one with an empty '/' segment.
  explicit Module(std::string name);

  const std::string& name() const { return name_; }
  // Throws ValueError on a name clash with a parameter or submodule, a rank mismatch between
  // the shape and the logical axes, or a negative size.
  Module& param(ParamDecl decl);
  Module& add(Module child);

  const std::vector<ParamDecl>& params() const { return params_; }
  const std::vector<Module>& children() const { return children_; }

  // Every parameter with its full path, depth first in declaration order
  // (the root module's own name starts each path only when `include_root` is true).
  void visit(const std::function<void(const std::string& path, const ParamDecl& decl)>& fn,
             bool include_root = false) const;
  size_t num_params() const;

 private:
  void visit_from(const std::string& prefix,
                  const std::function<void(const std::string&, const ParamDecl&)>& fn) const;
  void check_new_name(const std::string& name) const;
  std::string name_;
  std::vector<ParamDecl> params_;
  std::vector<Module> children_;
};

}  // namespace tessel
