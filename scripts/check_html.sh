#!/usr/bin/env bash
# Renders probe's html reports in headless Chromium and checks what a person would see:
# the demo compare's compare.html (the plot's points for both directions, the tolerance, the
# module bands, the culprit marker on Functional.gelu.1.forward, the module tree), the demo
# config packs' config_check.html, the bundled monitor pair's monitor.html; the inline script ran (data-ready on <html>), no console
# message, nothing fetched from elsewhere; a screenshot is taken.
#
#   scripts/check_html.sh              # skips (exit 0) when no chromium is installed
#   SCREENSHOT=docs/img/compare-html.png scripts/check_html.sh   # keep the demo screenshot
#
# In CI (CI=true) as root it installs Debian's chromium first (best effort). PROBE_BIN
# overrides the binary (default target/debug/probe, built when missing).
set -euo pipefail
cd "$(dirname "$0")/.."

find_browser() {
    local b
    for b in chromium chromium-browser google-chrome; do
        if command -v "$b" >/dev/null 2>&1; then
            command -v "$b"
            return 0
        fi
    done
    return 1
}

BROWSER=$(find_browser || true)
if [[ -z "$BROWSER" && "${CI:-}" == "true" && "$(id -u)" == "0" ]]; then
    echo "check_html: installing chromium (CI)"
    if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium; } >/dev/null 2>&1; then
        echo "check_html: could not install chromium (apt-get failed); continuing without it"
    fi
    BROWSER=$(find_browser || true)
fi
if [[ -z "$BROWSER" ]]; then
    echo "check_html: SKIP: no chromium installed (apt-get install chromium to run the browser checks)"
    exit 0
fi

PROBE=${PROBE_BIN:-target/debug/probe}
if [[ ! -x "$PROBE" ]]; then
    cargo build -q
fi

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
FAILED=0
fail() {
    echo "check_html: FAIL: $*" >&2
    FAILED=1
}

# Headless Chromium, sandbox off (containers run it as root), no GPU, quiet except console.
browse() {
    timeout 120 "$BROWSER" --headless --no-sandbox --disable-gpu --hide-scrollbars \
        --enable-logging=stderr --v=0 "$@"
}

# check_page FILE LABEL NEEDLE...: the DOM after the page's script ran holds every needle.
check_page() {
    local file=$1 label=$2
    shift 2
    local abs dom log before=$FAILED
    FAILED=0
    abs=$(cd "$(dirname "$file")" && pwd)/$(basename "$file")
    dom="$TMP/$label.dom.html"
    log="$TMP/$label.log"
    if ! browse --dump-dom "file://$abs" >"$dom" 2>"$log"; then
        fail "$label: chromium could not load $file (see below)"
        tail -5 "$log" >&2
        FAILED=1
        return
    fi
    if ! grep -Eq '<html[^>]* data-ready="[0-9]+"' "$dom"; then
        fail "$label: the page's script did not run (no data-ready on <html>)"
    fi
    if grep -q ':CONSOLE' "$log"; then
        fail "$label: console messages (a script error?):"
        grep ':CONSOLE' "$log" >&2
    fi
    # Self-contained: the only URL is the SVG namespace; no external script, style, image.
    if grep -Eo 'https?://[^"< ]+' "$file" | grep -qv '^http://www.w3.org/2000/svg$'; then
        fail "$label: refers to a URL: $(grep -Eo 'https?://[^"< ]+' "$file" | grep -v 'w3.org/2000/svg' | head -1)"
    fi
    if grep -Eq '<link|<script[^>]* src=|<img[^>]* src=' "$file"; then
        fail "$label: loads something from elsewhere"
    fi
    local needle
    for needle in "$@"; do
        if ! grep -Fq -- "$needle" "$dom"; then
            fail "$label: the rendered page lacks: $needle"
        fi
    done
    if [[ $FAILED -eq 0 ]]; then
        echo "check_html: $label: ok, $(grep -Eo 'data-ready="[0-9]+"' "$dom" | head -1)"
    fi
    FAILED=$((FAILED | before))
}

# --- compare.html of the demo (a 5 % fault injected into Functional.gelu.1: exit 1) -------
set +e
"$PROBE" compare -b testdata/demo/bench -c testdata/demo/cmp -o "$TMP/compare" -q
rc=$?
set -e
if [[ $rc -ne 1 ]]; then
    fail "demo compare exited $rc, expected 1 (a fault is injected)"
elif [[ ! -s "$TMP/compare/compare.html" ]]; then
    fail "demo compare wrote no compare.html"
else
    check_page "$TMP/compare/compare.html" compare \
        '<svg id="plot"' \
        'class="pt forward"' \
        'class="pt backward"' \
        'class="tol"' \
        'class="band"' \
        'class="culprit" data-op="Functional.gelu.1.forward"' \
        'first divergent op (forward): Functional.gelu.1.forward' \
        'id="modules"' \
        'id="findings"'
    if ! grep -Eq 'data-ready="[1-9][0-9]*"' "$TMP/compare.dom.html"; then
        fail "compare: the script found no plotted points"
    fi
    shot="$TMP/compare.png"
    browse --screenshot="$shot" --window-size=1400,1000 \
        "file://$TMP/compare/compare.html" >/dev/null 2>&1 || true
    if [[ ! -s "$shot" ]]; then
        fail "compare: no screenshot written"
    else
        echo "check_html: compare: screenshot $(wc -c <"$shot") bytes"
        if [[ -n "${SCREENSHOT:-}" ]]; then
            cp "$shot" "$SCREENSHOT"
            echo "check_html: saved $SCREENSHOT"
        fi
    fi
fi

# --- config_check.html of the demo packs (env.zip sets CUDA_LAUNCH_BLOCKING: exit 1) -------
set +e
"$PROBE" config-check testdata/config_check/base.zip testdata/config_check/env.zip \
    -o "$TMP/cc" -q
rc=$?
set -e
if [[ $rc -ne 1 ]]; then
    fail "demo config-check exited $rc, expected 1 (env.zip differs)"
else
    check_page "$TMP/cc/config_check.html" config-check \
        'id="categories"' \
        'id="cat-env" open' \
        'CUDA_LAUNCH_BLOCKING'
fi

# --- monitor.html of the bundled monitor pair (a kernel fault from step 40: exit 1) -------
set +e
"$PROBE" compare -b testdata/monitor/bench -c testdata/monitor/cmp -o "$TMP/monitor" -q
rc=$?
set -e
if [[ $rc -ne 1 ]]; then
    fail "monitor compare exited $rc, expected 1 (the runs part at step 40)"
else
    check_page "$TMP/monitor/monitor.html" monitor \
        'Metrics over the steps' \
        'the runs part at step 40' \
        'rank 0 (model) loss' \
        '>step 40</text>' \
        'id="facts"'
fi

if [[ $FAILED -ne 0 ]]; then
    echo "check_html: FAILED (browser: $BROWSER)" >&2
    exit 1
fi
echo "check_html: ok ($("$BROWSER" --version 2>/dev/null | head -1))"
