// What a driver reports about one device, in a form the Python side turns into a dict.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace zyfa {

struct DeviceInfo {
    std::string name;
    std::vector<std::pair<std::string, long long>> attributes;
};

// cuTensorMapEncodeTiled's arguments; the enums arrive as the driver's numeric values.
struct TensorMapRequest {
    int data_type;
    void* global_address;
    std::vector<std::uint64_t> dims;           // rank entries, innermost first
    std::vector<std::uint64_t> strides_bytes;  // rank - 1 entries: dimension 0 is dense
    std::vector<std::uint32_t> box_dims;
    std::vector<std::uint32_t> element_strides;
    int interleave;
    int swizzle;
    int l2_promotion;
    int oob_fill;
};

}  // namespace zyfa
