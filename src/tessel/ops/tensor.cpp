#include "tessel/ops/tensor.h"

#include <algorithm>

#include "tessel/core/error.h"
#include "tessel/ops/detail/node.h"

namespace tessel {

struct Tensor::Impl {
  Shape shape;
  DType dtype;
  NamedSharding sharding;
  std::optional<Array> value;
  std::vector<std::string> partial;
  std::shared_ptr<ops::detail::Node> node;
};

Tensor::Tensor(Array value) {
  Impl s{value.shape(), value.dtype(), value.sharding(), value, {}, nullptr};
  s_ = std::make_shared<const Impl>(std::move(s));
}

namespace {
std::vector<std::string> checked_partial(const NamedSharding& sharding, std::vector<std::string> partial) {
  const auto used = sharding.spec().used_axes();
  for (const auto& axis : partial) {
    sharding.mesh().axis_index(axis);  // throws on an unknown axis
    if (std::find(used.begin(), used.end(), axis) != used.end()) {
      throw ValueError("a tensor cannot be partial over '" + axis + "', which its sharding " +
                       sharding.spec().to_string() + " uses");
    }
  }
  std::sort(partial.begin(), partial.end());
  partial.erase(std::unique(partial.begin(), partial.end()), partial.end());
  return partial;
}
}  // namespace

Tensor Tensor::abstract(Shape shape, DType dtype, NamedSharding sharding, std::vector<std::string> partial) {
  sharding.device_box(sharding.mesh().device_ids().front(), shape);  // checks the rank
  partial = checked_partial(sharding, std::move(partial));
  return Tensor(std::make_shared<const Impl>(
      Impl{std::move(shape), dtype, std::move(sharding), std::nullopt, std::move(partial), nullptr}));
}

Tensor Tensor::partial_sum(Array contributions, std::vector<std::string> partial) {
  partial = checked_partial(contributions.sharding(), std::move(partial));
  Impl s{contributions.shape(), contributions.dtype(), contributions.sharding(), contributions, std::move(partial), nullptr};
  return Tensor(std::make_shared<const Impl>(std::move(s)));
}

const Tensor::Impl& Tensor::get() const {
  if (!s_) throw ValueError("use of an undefined Tensor");
  return *s_;
}

const Shape& Tensor::shape() const { return get().shape; }
DType Tensor::dtype() const { return get().dtype; }
const NamedSharding& Tensor::sharding() const { return get().sharding; }
bool Tensor::is_abstract() const { return !get().value.has_value(); }
const std::vector<std::string>& Tensor::partial() const { return get().partial; }
const std::shared_ptr<ops::detail::Node>& Tensor::node() const { return get().node; }

const Array& Tensor::shards() const {
  if (is_abstract()) throw ValueError("the tensor " + to_string() + " is abstract: it has no values");
  return *s_->value;
}

const Array& Tensor::array() const {
  if (is_partial()) throw ValueError("the tensor " + to_string() + " is a partial sum: reduce it first");
  return shards();
}

Tensor Tensor::with_node(std::shared_ptr<ops::detail::Node> node) const {
  Impl s = get();
  s.node = std::move(node);
  return Tensor(std::make_shared<const Impl>(std::move(s)));
}

std::string Tensor::to_string() const {
  std::string out = type_string(dtype(), shape()) + " " + sharding().spec().to_string();
  if (is_partial()) {
    out += " partial(";
    for (size_t i = 0; i < partial().size(); ++i) out += (i ? "," : "") + partial()[i];
    out += ")";
  }
  if (is_abstract()) out += " abstract";
  return out;
}

}  // namespace tessel
