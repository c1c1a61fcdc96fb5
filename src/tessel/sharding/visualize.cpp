#include "tessel/sharding/visualize.h"

#include <algorithm>
#include <map>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace tessel {
namespace {

// "0-3,6,8-9": devices compressed into runs.
std::string device_label(std::vector<int64_t> ids) {
  std::sort(ids.begin(), ids.end());
  std::vector<std::string> parts;
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
    parts.push_back(j == i ? fmt::format("{}", ids[i]) : fmt::format("{}-{}", ids[i], ids[j]));
    i = j + 1;
  }
  return fmt::format("{}", fmt::join(parts, ","));
}

std::string repeat(std::string_view s, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) out += s;
  return out;
}

std::string center(const std::string& s, size_t width) {
  size_t left = (width - s.size()) / 2;
  return std::string(left, ' ') + s + std::string(width - s.size() - left, ' ');
}

// One grid: rows along `row_dim` blocks (or a single row), columns along `col_dim` blocks.
std::string draw_grid(const std::vector<std::string>& row_heads, const std::vector<std::string>& col_heads,
                      const std::vector<std::vector<std::string>>& labels) {
  size_t width = 3;
  for (const auto& h : col_heads) width = std::max(width, h.size() + 2);
  for (const auto& row : labels)
    for (const auto& l : row) width = std::max(width, l.size() + 2);
  size_t margin = 0;
  for (const auto& h : row_heads) margin = std::max(margin, h.size());
  if (margin) margin += 1;
  const size_t cols = col_heads.size();

  auto rule = [&](const char* left, const char* mid, const char* right) {
    std::string line = std::string(margin, ' ') + left;
    for (size_t c = 0; c < cols; ++c) line += repeat("─", width) + (c + 1 < cols ? mid : right);
    return line + "\n";
  };
  std::string out = std::string(margin + 1, ' ');
  for (size_t c = 0; c < cols; ++c) out += center(col_heads[c], width) + " ";
  out += "\n" + rule("┌", "┬", "┐");
  for (size_t r = 0; r < labels.size(); ++r) {
    std::string head = row_heads.empty() ? "" : row_heads[r];
    out += (margin ? fmt::format("{:>{}} ", head, margin - 1) : std::string()) + "│";
    for (size_t c = 0; c < cols; ++c) out += center(labels[r][c], width) + "│";
    out += "\n";
    if (r + 1 < labels.size()) out += rule("├", "┼", "┤");
  }
  return out + rule("└", "┴", "┘");
}

}  // namespace

std::string visualize(const NamedSharding& sharding, const Shape& shape) {
  std::vector<ShardPlacement> shards = sharding.distinct_shards(shape);
  std::string out = fmt::format("shape {} {} on {}: {} distinct shard{}, {} cop{} each\n",
                                shape.to_string(), sharding.spec().to_string(),
                                sharding.mesh().to_string(), shards.size(), shards.size() == 1 ? "" : "s",
                                shards.front().devices.size(), shards.front().devices.size() == 1 ? "y" : "ies");
  std::vector<size_t> sharded;
  for (size_t d = 0; d < shape.rank(); ++d)
    if (sharding.num_blocks(d) > 1) sharded.push_back(d);

  // Grid axes: rank-2 arrays always draw rows x columns, like JAX; otherwise the last two sharded
  // dimensions (one sharded dimension of a 1-D array, or the last dimension, draws as a row).
  std::optional<size_t> row_dim, col_dim;
  if (shape.rank() == 2) {
    row_dim = 0;
    col_dim = 1;
  } else if (sharded.empty()) {
    if (shape.rank() > 0) col_dim = shape.rank() - 1;  // one cell, headed by the full range
  } else if (sharded.size() == 1) {
    if (sharded[0] + 1 == shape.rank()) col_dim = sharded[0]; else row_dim = sharded[0];
  } else if (sharded.size() >= 2) {
    row_dim = sharded[sharded.size() - 2];
    col_dim = sharded.back();
  }
  auto range = [](const Box& b, std::optional<size_t> d) {
    return d ? fmt::format("{}:{}", b.start(*d), b.stop(*d)) : std::string();
  };

  // distinct_shards() is in row-major block order, so a shard's block index along each dimension
  // is a mixed-radix digit of its ordinal (ranges alone would confuse the empty blocks of uneven
  // shapes).
  auto block_of = [&](size_t ordinal, size_t dim) {
    int64_t rest = static_cast<int64_t>(ordinal);
    for (size_t d = shape.rank(); d-- > dim + 1;) rest /= sharding.num_blocks(d);
    return rest % sharding.num_blocks(dim);
  };
  // Pages: one grid per combination of blocks of the sharded dimensions that are not on the grid.
  std::map<std::vector<int64_t>, std::vector<size_t>> pages;
  for (size_t i = 0; i < shards.size(); ++i) {
    std::vector<int64_t> key;
    for (size_t d : sharded)
      if (d != row_dim && d != col_dim) key.push_back(block_of(i, d));
    pages[key].push_back(i);
  }
  for (const auto& [key, members] : pages) {
    const Box& first = shards[members.front()].box;
    if (pages.size() > 1) {
      std::vector<std::string> where;
      for (size_t d : sharded)
        if (d != row_dim && d != col_dim)
          where.push_back(fmt::format("dim {} = {}:{}", d, first.start(d), first.stop(d)));
      out += fmt::format("{}\n", fmt::join(where, ", "));
    }
    int64_t nrows = row_dim ? sharding.num_blocks(*row_dim) : 1;
    int64_t ncols = col_dim ? sharding.num_blocks(*col_dim) : 1;
    std::vector<std::string> rows(static_cast<size_t>(nrows)), cols(static_cast<size_t>(ncols));
    std::vector<std::vector<std::string>> labels(rows.size(), std::vector<std::string>(cols.size()));
    for (size_t i : members) {
      size_t r = row_dim ? static_cast<size_t>(block_of(i, *row_dim)) : 0;
      size_t c = col_dim ? static_cast<size_t>(block_of(i, *col_dim)) : 0;
      rows[r] = range(shards[i].box, row_dim);
      cols[c] = range(shards[i].box, col_dim);
      labels[r][c] = device_label(shards[i].devices);
    }
    out += draw_grid(row_dim ? rows : std::vector<std::string>{}, cols, labels);
  }
  return out;
}

}  // namespace tessel
