# shellcheck shell=bash
# apt_get ARGS...: apt-get that waits for the apt/dpkg lock instead of failing at once. On a
# fresh machine another apt (unattended-upgrades, cloud-init, a second setup) holds it for
# minutes; apt-get's own DPkg::Lock::Timeout covers dpkg's lock but not the one `apt-get update`
# takes on the package lists, so every lock error is retried here, up to APT_LOCK_WAIT seconds
# (default 600), polling every APT_LOCK_POLL (default 5). Other errors fail at once, with
# apt-get's output. Sourced by setup-host.sh and install-factory.sh.
apt_get() {
  local out deadline=$((SECONDS + ${APT_LOCK_WAIT:-600}))
  while :; do
    if out=$(DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=60 "$@" 2>&1); then
      return 0
    fi
    if ! grep -qE "Could not get lock|Unable to lock|Unable to acquire the dpkg frontend lock" \
        <<<"$out" || [ "$SECONDS" -ge "$deadline" ]; then
      printf '%s\n' "$out" >&2
      return 1
    fi
    echo "== apt-get $1: waiting for the apt lock ($(grep -m1 -o 'held by process .*' <<<"$out" || echo 'another apt or dpkg'))"
    sleep "${APT_LOCK_POLL:-5}"
  done
}
