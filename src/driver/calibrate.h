/* int8 calibration (calibrate.c): --precision_mode=int8 --calibration_data=DIR
 * [--calibration_method=minmax|percentile[:P]|entropy]. A second copy of the model is brought
 * to the form the quantize pass sees (halves widened, shapes, the first simplify), the
 * activations it would quantize (passes.h: af_quant_activations) become graph outputs, the copy
 * is lowered (fp32, unfused) and run on the session's threads over every calibration sample;
 * each activation's range comes from those runs by the method:
 *   minmax      the smallest and largest value seen;
 *   percentile  |x| clipped at its P-th percentile (default 99.99) of a 2048-bin histogram;
 *   entropy     TensorRT's calibrator: the clip threshold of |x| whose quantization (128
 *               levels, 256 for a tensor never negative) of the 2048-bin histogram is nearest
 *               to it in KL divergence;
 * (the histograms leave exact zeros out: a ReLU's zeros, often half a tensor, are exact at any
 * range, and counted they pull the threshold down: entropy on ResNet-50 measured cosine 0.983
 * with them, 0.9999 without)
 * (the histograms need a first pass for each tensor's largest |x|, so those run the samples
 * twice). The result is kept for the process (keyed by the model's bytes, the folder, the
 * method and the input shapes), so that verify's culprit search, which compiles the model again
 * and again, calibrates once.
 *
 * Calibration samples: DIR holds one subfolder per sample (sorted by name), each with a file per
 * model input, <input name>.npy (characters outside [A-Za-z0-9_.-] as '_') or input_N.pb (N the
 * input's index: ONNX test-data sets, test_data_set_0/input_0.pb), or DIR holds those files
 * itself: one sample, or, when the model's dim 0 of every input is 1 and the files' is N, N
 * samples split along dim 0. Any error names the file. */
#ifndef AF_DRIVER_CALIBRATE_H
#define AF_DRIVER_CALIBRATE_H

#include "autofusion.h"
#include "onnx/onnx.h"
#include "passes/passes.h"

/* Calibrate model m (as loaded, before compiling) with opt's calibration_data,
 * calibration_method, input_shape and threads: *out receives the ranges (free with
 * af_quant_table_free). */
af_status af_calibrate(const af_model *m, const af_options *opt, af_quant_table **out,
                       af_error *err);
void af_quant_table_free(af_quant_table *t);

#endif
