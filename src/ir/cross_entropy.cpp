// Cross entropy's attributes (torch's ignore_index, label_smoothing, the normaliser) and their
// encoding in OpAttrs: the defaults are no attribute at all, so graphs made before them keep their
// JSON and fingerprint.
#include <fmt/ranges.h>

#include "weft/core/error.hpp"
#include "weft/ir/op.hpp"

namespace weft::ir {

CrossEntropyAttrs cross_entropy_attrs(const Op& op) {
  CrossEntropyAttrs c;
  const auto& a = op.attrs;
  if (!a.ints.empty()) {
    WEFT_CHECK(a.ints.size() == 2 && (a.ints[1] == 0 || a.ints[1] == 1),
               "op '{}': cross entropy attributes ints must be {{ignore_index, token_mean 0|1}}, got {}",
               op.name, a.ints);
    c.ignore_index = a.ints[0];
    c.token_mean = a.ints[1] == 1;
  }
  c.label_smoothing = a.scalar;
  WEFT_CHECK(c.label_smoothing >= 0 && c.label_smoothing <= 1, "op '{}': label smoothing {} is not in [0, 1]",
             op.name, c.label_smoothing);
  return c;
}

OpAttrs encode_cross_entropy_attrs(const CrossEntropyAttrs& c) {
  OpAttrs a;
  if (c.ignore_index != -100 || c.token_mean) a.ints = {c.ignore_index, c.token_mean ? 1 : 0};
  a.scalar = c.label_smoothing;
  return a;
}

bool cross_entropy_weighted(const Op& op) {
  return op.inputs.size() == (op.kind == OpKind::CrossEntropyGrad ? 4u : 3u);
}

}  // namespace weft::ir
