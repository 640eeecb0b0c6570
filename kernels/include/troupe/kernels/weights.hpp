#pragma once
/// @file
/// Saving and loading a model's weights.
///
/// Format (little-endian, version 1): the magic "TRPW", a u32 version, a varint count, then per
/// parameter its name, and its tensor in the wire codec (dtype, rank, dims, raw bytes); finally a
/// u32 CRC-32 (zlib's) of everything before it. Loading checks the magic, the version, the
/// checksum, and that every parameter's name and shape match the model, before it changes
/// anything: a failed load leaves the model as it was.

#include <string>

#include "troupe/kernels/layers.hpp"

namespace troupe::kernels {

/// Writes the parameters of `model`; throws std::runtime_error naming the file on I/O errors.
void save_weights(layer& model, const std::string& path);

/// Reads weights written by save_weights into `model`; throws std::runtime_error that says what
/// is wrong (missing file, not a weights file, another version, corrupted, truncated, or a model
/// of another shape) and leaves the model unchanged.
void load_weights(layer& model, const std::string& path);

}  // namespace troupe::kernels
