#pragma once
// What load_npz and load_idx_dir require of the data they load, in one place.

#include <string>

#include "troupe/kernels/data.hpp"

namespace troupe::detail {

/// The most dimensions an image tensor may have (what a tensor travels with on the wire).
inline constexpr int max_image_rank = 8;

/// How messages name the parts of a data set: the arrays of an .npz, the files of a directory.
struct part_names {
  std::string x_train, y_train, x_test, y_test, client_train;
};

/// Checks `data` as load_npz and load_idx_dir document it (images u8 or f32 of rank 2 to
/// max_image_rank with the same dtype and shape per example in both splits, at least one
/// training example, finite f32 features, u8 labels [N] matching the images, client_train
/// undefined or u32 [N_train]), then sets classes (the largest label plus one, at least 2),
/// mean and stddev. Throws std::runtime_error(prefix + part + ": " + problem).
void finish_labelled_data(labelled_data& data, const std::string& prefix, const part_names& names);

}  // namespace troupe::detail
