/* What the commands of the command line share (tools/autofusion.c holds the option table and
 * most commands; tools/verify.c the verify command). */
#ifndef AF_TOOLS_CLI_H
#define AF_TOOLS_CLI_H

#include "autofusion.h"

#include <stdbool.h>
#include <stdio.h>

#define MAX_INPUTS 64

typedef struct cli {
    const char *model;
    const char *output_dir;
    const char *input_shape;
    const char *input_shape_range;
    const char *input_name[MAX_INPUTS];
    const char *input_file[MAX_INPUTS];
    int ninputs;
    long seed;
    long iterations, warmup, threads, framework;
    bool compare, json, no_fusion;
    const char *output, *disable_fusion, *fusion_switch_file, *report, *log, *precision_mode;
    const char *keep_fp32, *rtol, *atol;
    const char *calibration_data, *calibration_method, *min_cosine;
    const char *export_onnx, *profile;
    char *command_line; /* the compile command as given (stored in the .afm) */
} cli;

/* The inputs of one run: the files given, random data for the rest. */
typedef struct inputs {
    af_tensor *t[MAX_INPUTS];
    const char *names[MAX_INPUTS];
    int n;
} inputs;

/* The options a command's session is opened with (the caller may change them before use). */
void cli_options(const cli *c, af_options *opt);
/* A session on c->model with opt; NULL after printing the error. */
af_session *cli_session(const cli *c, const af_options *opt);
/* The given input files, and seeded random data for the other declared inputs; 0 or 1. */
int inputs_make(const cli *c, const af_session *s, inputs *in);
void inputs_free(inputs *in);
/* One run into out (af_session_output_count slots); 0 or 1 after printing the error. */
int run_once(af_session *s, const inputs *in, af_tensor **out);
void outputs_free(af_tensor **out, int n);

int cmd_verify(const cli *c);

/* Print what `autofusion inspect` shows for the compiled model at path (inspect.c). */
af_status cli_inspect(const char *path, FILE *out, af_error *err);

#endif
