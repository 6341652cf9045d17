#!/usr/bin/env bash
# The two system tools tests drive: tmux, the real terminal of `podctl status --watch`'s test
# (crates/podctl/tests/observe.rs), and a real Prometheus, which crates/podctl/tests/prometheus.rs
# starts on loopback to scrape a local run. The main job needs neither.
#   sudo scripts/install-test-tools.sh        installs what is missing from the distribution's
#                                             archive as it is today (apt-get: Debian 12 has tmux
#                                             3.3a and prometheus 2.42), then checks and reports
#   scripts/install-test-tools.sh --check     checks only (no root); exits 1 naming what is
#                                             missing or out of range
# Checked by upstream version, against the range the tests support (`tmux -V`, `prometheus
# --version`), never pinned to an archive revision: Debian replaces a package's revision whenever
# the archive publishes an update, and the old revision is then gone.
set -euo pipefail

# The ranges the tests support, [min, below). tmux: `new-session -d -x -y` and `capture-pane -p`
# behave the same throughout 3.x. Prometheus: the tests use file service discovery and the v1
# query API; they ran against 2.42, and 3.0 changed scrape protocols and name validation, so 3.x
# is outside the range until the tests have run against it.
tmux_range=(3.0 4)
prometheus_range=(2.37 3)

# The upstream version a tool reports: "tmux 3.3a" -> 3.3a, "prometheus, version 2.42.0+ds (...)" -> 2.42.0.
version_of() {
  case $1 in
    tmux) tmux -V 2>/dev/null | awk '{print $2}' ;;
    prometheus) prometheus --version 2>&1 | awk 'NR == 1 {print $3}' | sed 's/+.*//' ;;
  esac
}

# Prints what is wrong with TOOL (a line starting with its name), or nothing.
check() {
  local tool=$1 min=$2 below=$3 version
  if ! command -v "$tool" >/dev/null; then
    echo "$tool is missing (the tests need $tool >= $min, < $below)"
    return
  fi
  version=$(version_of "$tool")
  # sort -V orders 3.3a after 3.3: in range when min sorts first and below sorts last.
  if [ -z "$version" ] || [ "$(printf '%s\n' "$min" "$version" | sort -V | head -n1)" != "$min" ] ||
    [ "$(printf '%s\n' "$version" "$below" | sort -V | tail -n1)" != "$below" ] || [ "$version" = "$below" ]; then
    echo "$tool ${version:-of unknown version} ($(command -v "$tool")) is outside the range the tests support (>= $min, < $below)"
  fi
}

problems() {
  check tmux "${tmux_range[@]}"
  check prometheus "${prometheus_range[@]}"
}

versions() {
  for tool in tmux prometheus; do
    echo "install-test-tools: $tool $(version_of "$tool") ($(command -v "$tool"))"
  done
}

case "${1:-}" in
  --check | "") ;;
  *) echo "usage: scripts/install-test-tools.sh [--check]" >&2; exit 2 ;;
esac
found=$(problems)
if [ -n "$found" ] && [ "${1:-}" != --check ]; then
  missing=$(echo "$found" | awk '{print $1}' | paste -sd' ' -)
  if [ "$(id -u)" != 0 ]; then
    echo "install-test-tools: installing $missing needs root: sudo scripts/install-test-tools.sh" >&2
    exit 1
  fi
  if ! command -v apt-get >/dev/null; then
    echo "install-test-tools: no apt-get here; install $missing with this system's package manager" \
      "(tmux >= ${tmux_range[0]}; prometheus >= ${prometheus_range[0]}, < ${prometheus_range[1]})" >&2
    exit 1
  fi
  echo "install-test-tools: installing $missing from the archive of $(. /etc/os-release && echo "$PRETTY_NAME")"
  apt-get update -qq
  # shellcheck disable=SC2086 # one word per package
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
  # The package's own service is not wanted: the test runs its own server on loopback.
  if [[ " $missing " == *" prometheus "* ]] && [ -d /run/systemd/system ]; then
    systemctl disable --now prometheus >/dev/null 2>&1 || true
  fi
  for package in $missing; do
    echo "install-test-tools: got $package $(dpkg-query -W -f '${Version}' "$package")"
  done
  found=$(problems)
fi
if [ -n "$found" ]; then
  echo "$found" | sed 's/^/install-test-tools: /' >&2
  echo "install-test-tools: install them with: sudo scripts/install-test-tools.sh" >&2
  exit 1
fi
versions
