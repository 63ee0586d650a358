# Sourced by the scripts that run vLLM on CPU (demo.sh, bench.sh): preloads TCMalloc, as vLLM's
# CPU installation guide asks ("set LD_PRELOAD"), so that every process they start, the one
# without speculation included, allocates alike. With glibc's malloc every buffer past 32 MiB
# is a fresh mmap, faulted in page by page at each use, which slows prefills (README: Deploying
# on CPU). SPECEXTEND_TCMALLOC=off runs with glibc's malloc.
if [ "${SPECEXTEND_TCMALLOC:-on}" != off ] && [[ "${LD_PRELOAD:-}" != *libtcmalloc* ]]; then
  tcmalloc="$(bash scripts/tcmalloc_path.sh)"
  if [ -n "$tcmalloc" ]; then
    export LD_PRELOAD="$tcmalloc${LD_PRELOAD:+:$LD_PRELOAD}"
    echo "== preloading $tcmalloc (vLLM's CPU guide; SPECEXTEND_TCMALLOC=off runs without)"
  else
    echo "== TCMalloc not found (apt-get install libtcmalloc-minimal4): glibc's malloc, slower prefills" >&2
  fi
fi
