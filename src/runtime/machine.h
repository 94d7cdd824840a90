/* Measuring the machine the cost model estimates for (machine.c).
 *
 * Invariant: af_machine_get measures at most once per process. */
#ifndef AF_RUNTIME_MACHINE_H
#define AF_RUNTIME_MACHINE_H

#include "fusion/fusion.h"

/* The machine file path: $AUTOFUSION_MACHINE_FILE, else $XDG_CACHE_HOME/autofusion/machine.json,
 * else $HOME/.cache/autofusion/machine.json; NULL when none can be formed. */
const char *af_machine_path(char *buf, size_t len);
/* Load m from `path` (NULL: af_machine_path) when it holds a valid record for the kernels' ISA
 * in force, else measure (about 500 ms) and write the record there (creating the folder; a
 * write failure is not an error). A record measured while other work kept the machine busy is
 * measured again by a call a minute or more later, keeping the best of every figure. */
af_status af_machine_calibrate(const char *path, af_machine *m, af_error *err);
/* The process-wide machine: calibrated once on first use (thread-safe). */
const af_machine *af_machine_get(void);

#endif
