#!/usr/bin/env bash
# The GoogLeNet benchmark suite under mpirun, Open MPI from Debian (see run_suite.sh).
exec "$(dirname "$0")/run_suite.sh" mpirun "$@"
