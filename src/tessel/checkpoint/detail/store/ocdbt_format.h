// Internal (not installed): the constants of TensorStore's OCDBT encoding that its reader and
// writer share.
#pragma once

#include <cstdint>

namespace tessel::detail::ocdbt_format {

inline constexpr uint32_t kManifestMagic = 0x0cdb3a2a;
inline constexpr uint32_t kVersionNodeMagic = 0x0cdb1234;
inline constexpr uint32_t kBtreeNodeMagic = 0x0cdb20de;
inline constexpr uint64_t kMaxEntries = 1048576;        // per B+tree node, as TensorStore
inline constexpr uint64_t kMaxInlineValue = 1 << 20;    // TensorStore's kMaxInlineValueLength
inline constexpr uint64_t kMaxManifestBytes = 64 << 20;
inline constexpr uint64_t kMaxNodeBytes = uint64_t{1} << 30;  // whatever the config says
inline constexpr uint64_t kMaxKeys = uint64_t{1} << 28;       // in one walk: a DAG must not explode
inline constexpr uint64_t kMissing = UINT64_MAX;              // an empty tree's root offset and length

}  // namespace tessel::detail::ocdbt_format
