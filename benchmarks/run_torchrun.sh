#!/usr/bin/env bash
# The GoogLeNet benchmark suite under torchrun (see run_suite.sh).
exec "$(dirname "$0")/run_suite.sh" torchrun "$@"
