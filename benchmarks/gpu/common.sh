# What the GPU scripts share (acceptance.sh, aarch64.sh, catalog.sh source it from the repository
# root, with ROOT and PY set): the carried wheels, the factory on the repository, host memory
# samples, the index served on loopback, and a clean venv that sees the machine's torch stack.

gpu_env() {  # gpu_env DIR: .whl/'s wheels (auditwheel, ...) into DIR/site; the factory importable
  local dir=$1
  if [ -d .whl ] && [ ! -d "$dir/site" ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$dir/site" .whl/*.whl
  fi
  export PYTHONPATH="$ROOT:$dir/site"
  export PATH="$dir/site/bin:$PATH"
  export FACTORY_MEMORY_HISTORY="$dir/memory_history.json"
  export CI=true  # plain progress lines in the logs
}

factory() { "$PY" -m factory "$@"; }

sample_memory() {  # sample_memory FILE: host memory used (MB) every 2 s, until killed
  while :; do
    echo "$(date +%s) $(free -m | awk '/Mem:/{print $3}')"
    sleep 2
  done >"$1"
}

serve_store() {  # serve_store STORE LOG: the index on 127.0.0.1:$PORT; its pid in SERVER
  # the interpreter itself in the background (through the factory function, $! would name a
  # subshell, and killing that would leave the server running)
  "$PY" -m factory serve --store "$1" --host 127.0.0.1 --port "$PORT" >"$2" 2>&1 &
  SERVER=$!
  for _ in $(seq 1 50); do
    "$PY" -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$PORT/simple/', timeout=2)" 2>/dev/null && break
    sleep 0.2
  done
}

clean_target() {  # clean_target DIR: a new venv that sees the machine's torch stack (through a
  # .pth file, since that stack is itself a venv) and nothing else
  rm -rf "$1"
  "$PY" -m venv "$1"
  "$PY" -c 'import site; print(site.getsitepackages()[0])' \
    >"$("$1/bin/python" -c 'import site; print(site.getsitepackages()[0])')/machine-torch-stack.pth"
}
