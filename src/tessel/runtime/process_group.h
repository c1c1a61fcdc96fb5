// The processes a Runtime spans, for the host-side work they do together: agreeing on a
// configuration, saving one checkpoint (each writes its own blocks; one commits after all are
// done). In one process every call returns at once.
//
//   tessel::ProcessGroup& g = rt.processes();
//   tessel::check_same(g, mesh.to_string(), "mesh");      // a ValueError on every process
//   tessel::run_together(g, "creating step 7", [&] { if (g.is_leader()) make_dirs(); });
//   auto crcs = tessel::gather_together(g, "writing step 7", [&] { return write_my_blocks(); });
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace tessel {

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int index() const = 0;
  virtual int count() const = 0;
  bool is_leader() const { return index() == 0; }
  // Every process passes its bytes and gets everyone's, by process index. A meeting point: throws
  // Error naming `what` and the processes that had not arrived within the group's timeout.
  virtual std::vector<std::string> all_gather(const std::string& mine, std::string_view what) = 0;
};

// The group of a single process.
class SingleProcessGroup final : public ProcessGroup {
 public:
  int index() const override { return 0; }
  int count() const override { return 1; }
  std::vector<std::string> all_gather(const std::string& mine, std::string_view) override { return {mine}; }
};

// Runs `fn` here, then meets the other processes. When `fn` failed anywhere, every process throws:
// a failed one its own exception, the others an Error naming `what`, the first failed process and
// its message. So no process goes on past a step another gave up on.
void run_together(ProcessGroup& group, std::string_view what, const std::function<void()>& fn);
// The same for an `fn` with a result: every process's, by process index.
std::vector<std::string> gather_together(ProcessGroup& group, std::string_view what,
                                         const std::function<std::string()>& fn);

// Throws ValueError on every process unless all pass the same `text` (a mesh, a model, rules),
// naming `what`, the first process that differs and both values.
void check_same(ProcessGroup& group, const std::string& text, std::string_view what);

}  // namespace tessel
