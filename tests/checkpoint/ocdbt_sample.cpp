// Writes the OCDBT database tests/checkpoint/ocdbt_crosscheck.py reads with an independent reader.
// Usage: ocdbt_sample DIR ZSTD(0|1). Keys "p<i % 7>/c/<i>", values of 1500 (out of line) or 10
// bytes of 'a' + i % 26, 200 keys in nodes of at most 4 entries (a tree of height 3).
#include <cstdlib>
#include <iostream>
#include <string>

#include "tessel/checkpoint/detail/store/ocdbt.h"
#include "tessel/core/error.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: ocdbt_sample DIR ZSTD\n";
    return 2;
  }
  try {
    tessel::detail::OcdbtWriter w(argv[1], {.max_node_entries = 4, .zstd = std::string(argv[2]) == "1", .durable = false});
    for (int i = 0; i < 200; ++i) {
      w.put("p" + std::to_string(i % 7) + "/c/" + std::to_string(i), std::string(i % 3 == 0 ? 1500 : 10, static_cast<char>('a' + i % 26)));
    }
    w.commit();
  } catch (const tessel::Error& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
  return 0;
}
