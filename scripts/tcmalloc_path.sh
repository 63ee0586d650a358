#!/usr/bin/env bash
# Prints the path of the system's libtcmalloc_minimal.so.4, or nothing where it is not installed.
ldconfig -p 2>/dev/null | awk '/libtcmalloc_minimal\.so\.4 / && !found {print $NF; found = 1}'
