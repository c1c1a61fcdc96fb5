// Crash safety: a saving process killed (SIGKILL) at random moments never leaves a partial step
// visible, and the previous step keeps restoring bit-identically.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "test_util.h"
#include "tessel/checkpoint/manager.h"

namespace tessel {
namespace {
namespace fs = std::filesystem;

pid_t spawn_helper(const fs::path& root, int64_t step) {
  const std::string r = root.string(), s = std::to_string(step);
  pid_t pid = fork();
  if (pid == 0) {
    execl(TESSEL_CKPT_HELPER, TESSEL_CKPT_HELPER, "manager", r.c_str(), s.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

int wait_for(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

std::map<std::string, HostArray> restore_all(const Runtime& rt, const fs::path& item) {
  std::map<std::string, HostArray> out;
  for (const auto& [path, v] : restore(rt, item, TargetSpec{.placement = Placement::kAsSaved})) {
    out.emplace(path, to_host(v.array()));
  }
  return out;
}

TEST(CheckpointCrash, KilledSavesLeaveThePreviousStepsIntact) {
  testing::TempDir tmp;
  const fs::path root = tmp.path() / "ckpt";
  Runtime rt = Runtime::host(8);
  // The kill times scale with the median of three whole saves: one save alone can run several
  // times slower than the rest (a cold binary, a busy machine), which would put most kills after
  // the save has finished.
  std::vector<std::chrono::steady_clock::duration> saves;
  for (int64_t step = 1; step <= 3; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    const int status = wait_for(spawn_helper(root, step));
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the helper failed on its own";
    saves.push_back(std::chrono::steady_clock::now() - t0);
  }
  std::sort(saves.begin(), saves.end());
  const auto full = saves[1];
  const auto reference = restore_all(rt, root / "1" / "default");
  ASSERT_GT(reference.size(), 10u);

  std::mt19937 rng(11);
  int completed = 0, killed = 0, mid_save = 0;
  for (int64_t i = 0; i < 50; ++i) {
    const int64_t step = i + 4;
    const pid_t pid = spawn_helper(root, step);
    const auto delay = std::chrono::duration_cast<std::chrono::microseconds>(full) *
                       std::uniform_real_distribution<double>(0.0, 1.2)(rng);
    std::this_thread::sleep_for(delay);
    kill(pid, SIGKILL);
    const int st = wait_for(pid);
    const bool finished = WIFEXITED(st) && WEXITSTATUS(st) == 0;
    (finished ? completed : killed) += 1;
    SCOPED_TRACE("save of step " + std::to_string(step) + (finished ? " finished" : " killed"));

    const std::vector<int64_t> steps = list_steps(root);
    ASSERT_EQ(steps.front(), 1);
    for (int64_t s : steps) {
      // Every listed step is complete and sound.
      ASSERT_TRUE(fs::exists(root / std::to_string(s) / "commit_success.txt")) << s;
      const VerifyReport r = verify(CheckpointItem::open(root / std::to_string(s) / "default"));
      ASSERT_TRUE(r.faults.empty()) << r.faults.front();
    }
    const bool listed = std::find(steps.begin(), steps.end(), step) != steps.end();
    if (finished) EXPECT_TRUE(listed);
    EXPECT_EQ(restore_all(rt, root / "1" / "default"), reference);
    if (fs::exists(root / (std::to_string(step) + ".orbax-checkpoint-tmp"))) mid_save += 1;
    if (listed) fs::remove_all(root / std::to_string(step));
    { CheckpointManager cleanup(root); }  // removes what the killed save left
    for (const auto& e : fs::directory_iterator(root)) {
      EXPECT_EQ(e.path().filename().string().find(".orbax-checkpoint-tmp"), std::string::npos) << e.path();
    }
  }
  std::cout << "[ crash    ] " << killed << " saves killed (" << mid_save << " while writing files), " << completed
            << " finished\n";
  EXPECT_GE(mid_save, 5);
}

}  // namespace
}  // namespace tessel
