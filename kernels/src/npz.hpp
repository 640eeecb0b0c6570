#pragma once
// load_npz's inner parts, reached by the tests and by the fuzzer (tests/fuzz/npz_fuzz.cpp):
// the loader of an archive held in memory, and the reader of one .npy array.

#include <cstddef>
#include <span>
#include <string>

#include "troupe/kernels/data.hpp"

namespace troupe::detail {

/// What an array of an .npz is, and so which dtypes and shapes it may have (see load_npz).
enum class npy_role {
  features,  ///< x_train, x_test: '|u1' or '<f4'/'>f4', rank 2 to 8; read as u8 or f32
  labels,    ///< y_train, y_test: an integer dtype, rank 1, values 0..255; read as u8
  clients,   ///< client_train: an integer dtype, rank 1, values 0..2^32-1; read as u32
};

/// The largest .npy header (the dictionary after the magic, version and length) read_npy
/// accepts: NumPy writes about 128 bytes for the dtypes load_npz reads.
inline constexpr std::size_t max_npy_header = std::size_t{1} << 16;

/// Reads one .npy file held in `bytes` as `role` requires; `where` starts every message
/// ("load_npz: mine.npz: x_train.npy"). Throws std::runtime_error(where + ": " + problem) for
/// the problems load_npz lists that one array can have on its own (a malformed or lying
/// header, a refused dtype or rank, fortran_order, a label or client out of range, truncated
/// data, trailing bytes), the whole of `bytes` being the array's entry. Features are not checked
/// for being finite here: load_npz does that once the arrays are together.
tensor read_npy_bytes(std::span<const std::byte> bytes, npy_role role, const std::string& where);

/// load_npz on an archive held in memory; `name` stands for the path in the messages.
labelled_data load_npz_bytes(std::span<const std::byte> archive, const std::string& name);

}  // namespace troupe::detail
