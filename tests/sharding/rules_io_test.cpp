#include "tessel/sharding/rules_io.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "test_util.h"
#include "tessel/core/error.h"

namespace tessel {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

TEST(RulesIo, LoadsMaxTextBaseYmlAsIs) {
  LogicalRules rules = load_rules(testing::testdata("maxtext/base.yml"));
  EXPECT_EQ(rules.mesh_axes().size(), 12u);
  EXPECT_EQ(rules.mesh_axes()[3], "fsdp");
  ASSERT_GT(rules.rules().size(), 50u);
  const LogicalRule& first = rules.rules()[0];
  EXPECT_EQ(first.logical, "circular_repeats");
  EXPECT_TRUE(first.mesh_axes.empty());
  EXPECT_EQ(first.line, 533);  // line numbers point into the file
  bool saw_fallback = false;
  for (size_t i = 1; i < rules.rules().size(); ++i)
    if (rules.rules()[i].logical == "embed" && rules.rules()[i - 1].logical == "embed") {
      saw_fallback = true;
      EXPECT_EQ(rules.rules()[i].mesh_axes, (std::vector<std::string>{"fsdp", "context", "context_usp_ulysses", "expert"}));
    }
  EXPECT_TRUE(saw_fallback);
}

TEST(RulesIo, YamlFormsOfMeshAxes) {
  LogicalRules r = parse_rules_yaml(
      "logical_axis_rules:\n"
      "  - [embed, fsdp]\n"
      "  - ['mlp', ['tensor', 'stage']]\n"
      "  - [kv, []]\n"
      "  - [norm, null]\n");
  ASSERT_EQ(r.rules().size(), 4u);
  EXPECT_EQ(r.rules()[0].mesh_axes, (std::vector<std::string>{"fsdp"}));
  EXPECT_EQ(r.rules()[1].mesh_axes, (std::vector<std::string>{"tensor", "stage"}));
  EXPECT_TRUE(r.rules()[2].mesh_axes.empty());
  EXPECT_TRUE(r.rules()[3].mesh_axes.empty());
  EXPECT_EQ(r.rules()[1].line, 3);
  EXPECT_TRUE(r.mesh_axes().empty());
  // A bare list is accepted too.
  EXPECT_EQ(parse_rules_yaml("[[embed, fsdp]]").rules().size(), 1u);
}

TEST(RulesIo, JsonObjectAndBareList) {
  LogicalRules r = parse_rules_json(R"({"mesh_axes": ["data", "fsdp"],
      "logical_axis_rules": [["embed", "fsdp"], ["batch", ["data"]], ["kv", []], ["x", null]]})");
  EXPECT_EQ(r.rules().size(), 4u);
  EXPECT_EQ(r.mesh_axes(), (std::vector<std::string>{"data", "fsdp"}));
  EXPECT_EQ(parse_rules_json(R"([["embed", "fsdp"]])").rules().size(), 1u);
}

TEST(RulesIo, FileExtensionPicksTheParser) {
  testing::TempDir dir;
  auto json = dir.write("r.json", R"({"logical_axis_rules": [["embed", "fsdp"]]})");
  auto yaml = dir.write("r.yaml", "logical_axis_rules: [[embed, fsdp]]\n");
  EXPECT_EQ(load_rules(json).rules().size(), 1u);
  EXPECT_EQ(load_rules(yaml).rules().size(), 1u);
  auto bad = dir.write("bad.json", "logical_axis_rules: [[embed, fsdp]]\n");  // YAML in a .json
  EXPECT_THROW(load_rules(bad), ParseError);
}

TEST(RulesIo, MalformedYamlReportsLine) {
  EXPECT_THAT([] { parse_rules_yaml("logical_axis_rules: [\n  [embed, fsdp],\n  [mlp, [tensor\n", "r.yml"); },
              ThrowsMessage<ParseError>(AllOf(HasSubstr("r.yml:"), HasSubstr("invalid YAML"))));
  try {
    parse_rules_yaml("a: 1\nlogical_axis_rules:\n  - [embed, fsdp]\n  - [mlp]\n", "r.yml");
    FAIL() << "no error";
  } catch (const ParseError& e) {
    EXPECT_EQ(e.line(), 4);
    EXPECT_THAT(e.what(), HasSubstr("entry 1 must be a [logical_name, mesh_axes] pair, got a list of 1 items"));
  }
}

TEST(RulesIo, BadYamlStructuresAreNamed) {
  EXPECT_THAT([] { parse_rules_yaml("foo: 1\n", "r.yml"); },
              ThrowsMessage<ParseError>(HasSubstr("no 'logical_axis_rules' key")));
  EXPECT_THAT([] { parse_rules_yaml("logical_axis_rules: 3\n", "r.yml"); },
              ThrowsMessage<ParseError>(HasSubstr("must be a list of [name, mesh axes] pairs, got a scalar")));
  EXPECT_THAT([] { parse_rules_yaml("logical_axis_rules: [[[a], fsdp]]\n", "r.yml"); },
              ThrowsMessage<ParseError>(HasSubstr("logical name must be a string, got a list")));
  EXPECT_THAT([] { parse_rules_yaml("logical_axis_rules: [[a, {x: 1}]]\n", "r.yml"); },
              ThrowsMessage<ParseError>(HasSubstr("got a map")));
  EXPECT_THAT([] { parse_rules_yaml("logical_axis_rules: [[a, [[x]]]]\n", "r.yml"); },
              ThrowsMessage<ParseError>(HasSubstr("mesh axis must be a name, got a list")));
  EXPECT_THAT([] { parse_rules_yaml("logical_axis_rules: [[a, x]]\nmesh_axes: x\n", "r.yml"); },
              ThrowsMessage<ParseError>(HasSubstr("mesh_axes must be a list")));
  EXPECT_THAT([] { parse_rules_yaml("logical_axis_rules: [[a, [x, x]]]\n", "r.yml"); },
              ThrowsMessage<ValueError>(AllOf(HasSubstr("rule #1 a -> (x, x) [r.yml:1]"), HasSubstr("'x' twice"))));
  EXPECT_THAT([] { parse_rules_yaml("logical_axis_rules: [[a, x]]\nmesh_axes: [data, '']\n", "r.yml"); },
              ThrowsMessage<ValueError>(HasSubstr("r.yml: mesh_axes entry 1 is an empty name")));
  EXPECT_THAT([] { parse_rules_yaml("logical_axis_rules: [[a, x]]\nmesh_axes: [data, data]\n", "r.yml"); },
              ThrowsMessage<ValueError>(HasSubstr("r.yml: mesh_axes lists 'data' twice")));
  EXPECT_THAT([] { parse_rules_yaml("logical_axis_rules: [['', x]]\n", "r.yml"); },
              ThrowsMessage<ValueError>(HasSubstr("empty logical name")));
}

TEST(RulesIo, BadJsonIsNamed) {
  EXPECT_THAT([] { parse_rules_json("{\n  \"logical_axis_rules\": [[\"a\", \"x\"],\n  ]\n}", "r.json"); },
              ThrowsMessage<ParseError>(HasSubstr("r.json:3:")));
  EXPECT_THAT([] { parse_rules_json(R"({"logical_axis_rules": [["a", 1]]})", "r.json"); },
              ThrowsMessage<ParseError>(HasSubstr("logical_axis_rules[0]: mesh axes must be")));
  EXPECT_THAT([] { parse_rules_json(R"({"logical_axis_rules": [["a"]]})", "r.json"); },
              ThrowsMessage<ParseError>(HasSubstr("an array of 1 items")));
  EXPECT_THAT([] { parse_rules_json(R"({"rules": []})", "r.json"); },
              ThrowsMessage<ParseError>(HasSubstr("no \"logical_axis_rules\" key")));
  EXPECT_THAT([] { parse_rules_json(R"(42)", "r.json"); },
              ThrowsMessage<ParseError>(HasSubstr("got number")));
}

TEST(RulesIo, MissingFileIsAnIoError) {
  EXPECT_THAT([] { load_rules("/nonexistent/rules.yml"); },
              ThrowsMessage<IoError>(HasSubstr("cannot open '/nonexistent/rules.yml'")));
  testing::TempDir dir;
  EXPECT_THAT([&] { load_rules(dir.path()); }, ThrowsMessage<IoError>(HasSubstr("is a directory")));
}

}  // namespace
}  // namespace tessel
