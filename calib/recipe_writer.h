// Recipe step "writer" (calib/recipe.h): the float tensors every scheme writes the same way (layer
// norms and their biases, QK-norms, post norms, embedding norm, learned positions, final norm) and
// the header fields that do not depend on the scheme.
#pragma once

#include "calib/recipe.h"

namespace sq {

/// Embedding-side globals (embedding norm, learned positions): written after the token embedding.
void write_embedding_globals(SqmWriter& out, const ConvertInputs& in, ConvertScheme encoding);
/// Layer `w`'s non-linear tensors (decoder_layer_tensors order) from w.tensors.
void write_layer_tensors(SqmWriter& out, const ConvertInputs& in, const LayerWork& w, ConvertScheme encoding);
/// The final norm weight (and bias).
void write_final_norm(SqmWriter& out, const ConvertInputs& in, ConvertScheme encoding);
/// header: producer, model_config, source; the tokenizer (tensor added to `out`), calibration provenance.
nlohmann::json converter_header(SqmWriter& out, const ConvertInputs& in);

}  // namespace sq
