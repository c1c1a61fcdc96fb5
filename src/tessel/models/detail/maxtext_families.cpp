#include "tessel/models/detail/maxtext_families.h"

#include "tessel/core/error.h"

namespace tessel::maxtext {
namespace {

std::vector<Stack> one_stack(const MaxTextConfig& c) { return {{"layers", c.num_decoder_layers, false}}; }

// DeepSeek: first_num_dense_layers dense layers, then the MoE layers.
std::vector<Stack> dense_then_moe(const MaxTextConfig& c) {
  return {{"dense_layers", c.first_num_dense_layers, false},
          {"moe_layers", c.num_decoder_layers - c.first_num_dense_layers, true}};
}

int64_t one_layer(const MaxTextConfig&) { return 1; }

template <const char* Holder>
std::vector<std::string> holds(bool) {
  return {Holder};
}
constexpr char kSelfAttention[] = "self_attention";
constexpr char kMoeBlock[] = "MoeBlock_0";
constexpr char kQwen3MoeBlock[] = "moe_block";
constexpr char kGptOssAttention[] = "layers_0/GptOssAttention";

std::vector<std::string> deepseek_holders(bool moe) {
  return moe ? std::vector<std::string>{"DeepSeekMoeBlock_0/MoeBlock_0"} : std::vector<std::string>{""};
}

template <Module (*Build)(std::string, const MaxTextConfig&)>
Module plain(std::string name, const MaxTextConfig& c, bool) {
  return Build(std::move(name), c);
}

const std::vector<Family> kFamilies = {
    {MaxTextFamily::kLlama2, "llama2", false, one_stack, plain<llama2_layer>, plain<llama2_layer>, one_layer,
     [](const MaxTextConfig& c, const Weights& w, const Tensor& x, int64_t, bool, std::vector<Tensor>&) {
       return llama2_layer_forward(c, w, x);
     },
     holds<kSelfAttention>},
    {MaxTextFamily::kQwen3, "qwen3", false, one_stack, plain<qwen3_layer>, plain<qwen3_layer>, one_layer,
     [](const MaxTextConfig& c, const Weights& w, const Tensor& x, int64_t, bool, std::vector<Tensor>&) {
       return qwen3_layer_forward(c, w, x);
     },
     holds<kSelfAttention>},
    {MaxTextFamily::kMixtral, "mixtral", true, one_stack, plain<mixtral_layer>, plain<mixtral_layer>, one_layer,
     [](const MaxTextConfig& c, const Weights& w, const Tensor& x, int64_t, bool, std::vector<Tensor>& aux) {
       return mixtral_layer_forward(c, w, x, aux);
     },
     holds<kMoeBlock>},
    {MaxTextFamily::kQwen3Moe, "qwen3_moe", true, one_stack, plain<qwen3_moe_layer>, plain<qwen3_moe_layer>, one_layer,
     [](const MaxTextConfig& c, const Weights& w, const Tensor& x, int64_t, bool, std::vector<Tensor>& aux) {
       return qwen3_moe_layer_forward(c, w, x, aux);
     },
     holds<kQwen3MoeBlock>},
    {MaxTextFamily::kDeepseek, "deepseek", true, dense_then_moe,
     [](std::string name, const MaxTextConfig& c, bool moe) {
       return moe ? deepseek_moe_layer(std::move(name), c) : deepseek_dense_layer(std::move(name), c);
     },
     [](std::string name, const MaxTextConfig& c, bool moe) {
       return moe ? deepseek_moe_layer(std::move(name), c) : deepseek_dense_layer(std::move(name), c);
     },
     one_layer,
     [](const MaxTextConfig& c, const Weights& w, const Tensor& x, int64_t, bool moe, std::vector<Tensor>& aux) {
       return deepseek_layer_forward(c, w, x, moe, aux);
     },
     deepseek_holders},
    {MaxTextFamily::kGptOss, "gpt_oss", true, one_stack, plain<gpt_oss_layer>, plain<gpt_oss_block>,
     [](const MaxTextConfig& c) { return c.inhomogeneous_layer_cycle_interval; },
     [](const MaxTextConfig& c, const Weights& w, const Tensor& x, int64_t index, bool, std::vector<Tensor>& aux) {
       return gpt_oss_layer_forward(c, w, x, index, aux);
     },
     holds<kGptOssAttention>},
};

}  // namespace

const std::vector<Family>& families() { return kFamilies; }

const Family* find_family(std::string_view decoder_block) {
  for (const Family& f : kFamilies)
    if (f.decoder_block == decoder_block) return &f;
  return nullptr;
}

const Family& family_of(const MaxTextConfig& c) {
  for (const Family& f : kFamilies)
    if (f.family == c.family) return f;
  throw ValueError("decoder_block '" + c.decoder_block + "' is not one tessel builds");
}

std::string family_names() {
  std::string out;
  for (const Family& f : kFamilies) out += (out.empty() ? "" : ", ") + std::string(f.decoder_block);
  return out;
}

}  // namespace tessel::maxtext
