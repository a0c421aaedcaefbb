#!/usr/bin/env bash
# Renders the perf report's charts with headless Chromium, so that a person
# (or a reviewer without a browser) can check that they draw: one PNG per
# SVG chart (<chart>.png) and one of the whole report page (report.png).
#
# usage: perf/report/screenshot.sh [DIR]      (default build/perf)
# Needs chromium (Debian: apt-get install -y chromium); exit 3 without it,
# 1 when a screenshot is missing or empty.
set -uo pipefail

dir=$(realpath -m "${1:-build/perf}")
browser=""
for candidate in chromium chromium-browser google-chrome; do
  if command -v "${candidate}" >/dev/null; then browser=${candidate}; break; fi
done
if [[ -z "${browser}" ]]; then
  echo "screenshot.sh: no chromium found; install it (apt-get install -y chromium) to render" \
    "the charts to PNG" >&2
  exit 3
fi
[[ -f "${dir}/report.html" ]] || { echo "screenshot.sh: no ${dir}/report.html; run make_report.py first" >&2; exit 1; }

# One screenshot: file, png, width, height. Chromium's own profile in a
# temporary folder (a shared machine's HOME may not be writable).
profile=$(mktemp -d)
trap 'rm -rf "${profile}"' EXIT
shoot() {
  timeout 60 "${browser}" --headless --no-sandbox --disable-gpu --hide-scrollbars \
    --user-data-dir="${profile}" --window-size="$3,$4" --screenshot="$2" "file://$1" \
    >/dev/null 2>&1
}

failures=0
for svg in "${dir}"/*.svg; do
  [[ -e "${svg}" ]] || continue
  # The chart's own size, from its root element.
  size=$(sed -n 's/.*<svg [^>]*width="\([0-9]*\)" height="\([0-9]*\)".*/\1 \2/p' "${svg}" | head -1)
  read -r width height <<<"${size:-900 600}"
  png="${svg%.svg}.png"
  rm -f "${png}"
  shoot "${svg}" "${png}" "${width}" "${height}"
  if [[ -s "${png}" ]]; then
    echo "screenshot.sh: ${png}"
  else
    echo "screenshot.sh: failed to render ${svg}" >&2
    failures=$((failures + 1))
  fi
done
rm -f "${dir}/report.png"
shoot "${dir}/report.html" "${dir}/report.png" 1450 6000
if [[ -s "${dir}/report.png" ]]; then
  echo "screenshot.sh: ${dir}/report.png (the whole report page)"
else
  echo "screenshot.sh: failed to render ${dir}/report.html" >&2
  failures=$((failures + 1))
fi
[[ ${failures} -eq 0 ]]
