#include <gtest/gtest.h>

#include "core/tensor.h"

TEST(Tensor, CloneIsDeepAndOwned) {
  auto t = sq::Tensor::from_vector({2, 2}, {1, 2, 3, 4});
  auto c = t.clone();
  c.mutable_data()[0] = 9;
  EXPECT_EQ(t.data()[0], 1.0f);
  EXPECT_EQ(c.data()[0], 9.0f);
  EXPECT_EQ(c.shape_string(), "[2, 2]");
}
