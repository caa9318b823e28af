#!/usr/bin/env bash
# Print the path of a redis-server >= 8.4 on stdout; everything else (what it
# does, the build's progress) goes to stderr, so `srv=$(scripts/redis.sh)` works.
#
# Order of preference:
#   1. $LBS_REDIS_SERVER, if set (must be new enough, or this fails);
#   2. a redis-server on PATH that is new enough;
#   3. a build cached under ${XDG_CACHE_HOME:-~/.cache}/lbs/redis/<version>/;
#   4. a fresh build of Debian's source package of Redis (suite "experimental",
#      which carries 8.6), fetched from the same mirror as the machine's own
#      Debian entry (about 4 MB), then cached as in 3. Only the first run
#      builds: 1.5-6 min on 2 cores, a status line showing what is being
#      compiled; later runs find the cache at once.
#
# It never installs, starts or reconfigures the system's Redis and never edits
# /etc/apt: the experimental entry lives in a private sources file and the
# package lists in a private directory under the cache.
#
# Usage: scripts/redis.sh [--min-version 8.4] [--below VERSION] [--suite experimental] [--rebuild]
#
# The fallback tests' Redis 7.x comes the same way from Debian stable's source
# package (`make test` asks for it): scripts/redis.sh --redis7, short for
# --min-version 7.0 --below 8.0 --suite <this machine's Debian codename>, with
# $LBS_REDIS7_SERVER in place of $LBS_REDIS_SERVER.
set -euo pipefail

MIN_VERSION="${LBS_REDIS_MIN_VERSION:-8.4}"
BELOW=""
SUITE=experimental
ENV_VAR=LBS_REDIS_SERVER
REBUILD=0
while [ $# -gt 0 ]; do
    case "$1" in
        --min-version) MIN_VERSION="$2"; shift 2 ;;
        --below) BELOW="$2"; shift 2 ;;
        --suite) SUITE="$2"; shift 2 ;;
        --redis7)
            MIN_VERSION=7.0; BELOW=8.0; ENV_VAR=LBS_REDIS7_SERVER
            SUITE="$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")"
            [ -n "$SUITE" ] || SUITE=stable
            shift ;;
        --rebuild) REBUILD=1; shift ;;
        -h|--help) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "redis.sh: unknown argument: $1" >&2; exit 2 ;;
    esac
done

CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/lbs/redis"
log() { echo "redis.sh: $*" >&2; }
die() { echo "redis.sh: error: $*" >&2; exit 1; }

# How long the build takes, measured on a 2-core machine (other work running beside it makes it slower).
BUILD_TIME_NOTE="it takes 1.5-6 min on 2 cores (less with more), once"

mmss() { printf '%d:%02d' $(($1 / 60)) $(($1 % 60)); }

# The build's progress from its log: what it is compiling now and how many files so far.
# Redis's own Makefile prints "CC file.o" / "LINK redis-server" (in colour), its dependencies
# "MAKE <name>" and then their compiler command lines.
build_status() {
    sed 's/\x1b\[[0-9;]*m//g' "$1" 2>/dev/null | awk '
        / -c / && /\.c( |$)/ { files++ }
        $1 == "CC" && $2 ~ /\.o$/ { files++; if ($2 !~ /\//) { redis = 1; last = $2 } }
        $1 == "LINK" && NF == 2 { redis = 1; last = $2 " (linking)" }
        $1 == "MAKE" && NF == 2 { dep = $2 }
        END {
            if (redis) stage = "redis: " last
            else if (dep != "") stage = "dependencies: " dep
            else stage = "configuring"
            printf "%d files compiled, %s", files, stage
        }'
}

# show_progress PID LOG: while PID runs, one status line on stderr: rewritten in place
# every half second on a terminal, else printed every 30 s (a CI log).
show_progress() {
    local pid="$1" build_log="$2" spin='|/-\' i=0 next=30 line width
    width="$(tput cols 2>/dev/null || echo 100)"
    while kill -0 "$pid" 2>/dev/null; do
        line="$(mmss $((SECONDS - STARTED))) elapsed, $(build_status "$build_log")"
        if [ -t 2 ]; then
            printf '\r\033[Kredis.sh: %s %s' "${spin:i++%4:1}" "${line:0:$((width - 14))}" >&2
            sleep 0.5
        else
            if [ $((SECONDS - STARTED)) -ge "$next" ]; then
                log "  $line"
                next=$((next + 30))
            fi
            sleep 1
        fi
    done
    if [ -t 2 ]; then printf '\r\033[K' >&2; fi
    log "  make ended after $(mmss $((SECONDS - STARTED))), $(build_status "$build_log" | cut -d, -f1)"
}

# "Redis server v=8.6.3 sha=..." -> 8.6.3
server_version() { "$1" --version 2>/dev/null | sed -n 's/.* v=\([0-9][0-9.]*\).*/\1/p'; }

# version_ge A B: true when dotted version A >= B
version_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]; }

good_enough() {
    local bin="$1" v
    [ -x "$bin" ] || return 1
    v="$(server_version "$bin")"
    [ -n "$v" ] && version_ge "$v" "$MIN_VERSION" && { [ -z "$BELOW" ] || ! version_ge "$v" "$BELOW"; }
}
WANTED=">= $MIN_VERSION${BELOW:+ and < $BELOW}"

if [ -n "${!ENV_VAR:-}" ]; then
    good_enough "${!ENV_VAR}" || die "$ENV_VAR=${!ENV_VAR} is not a redis-server $WANTED"
    echo "${!ENV_VAR}"; exit 0
fi

if [ "$REBUILD" = 0 ]; then
    if on_path="$(command -v redis-server 2>/dev/null)" && good_enough "$on_path"; then
        echo "$on_path"; exit 0
    fi
    # Newest cached build first.
    if [ -d "$CACHE" ]; then
        for dir in $(ls -1 "$CACHE" 2>/dev/null | grep -E '^[0-9]+(\.[0-9]+)*$' | sort -rV); do
            if good_enough "$CACHE/$dir/bin/redis-server"; then
                echo "$CACHE/$dir/bin/redis-server"; exit 0
            fi
        done
    fi
fi

# ---------------------------------------------------------------- build ----
command -v apt-get >/dev/null || die "no redis-server $WANTED found and apt-get is missing, so it cannot be built; set $ENV_VAR to one"
command -v make >/dev/null && command -v gcc >/dev/null \
    || die "building Redis needs make and gcc (apt-get install build-essential)"

# The mirror of the machine's existing Debian entry. deb822 files first
# (Types/URIs/Suites stanzas), then the one-line sources.list format. Skip the
# security archive: it carries no experimental suite.
find_debian_uri() {
    local f
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -r "$f" ] || continue
        awk 'BEGIN{RS=""; FS="\n"}
             { uri=""; deb=0
               for (i=1;i<=NF;i++) {
                 if ($i ~ /^URIs:/) { sub(/^URIs:[ \t]*/, "", $i); split($i, u, /[ \t]+/); uri=u[1] }
                 if ($i ~ /^Types:.*deb/) deb=1
               }
               if (deb && uri ~ /\/debian\/?$/) { print uri; exit } }' "$f"
    done | head -n1
    if [ -r /etc/apt/sources.list ]; then
        awk '$1 ~ /^deb(-src)?$/ { for (i=2;i<=NF;i++) if ($i ~ /^[a-z]+:\/\//) { if ($i ~ /\/debian\/?$/) print $i; break } }' \
            /etc/apt/sources.list | head -n1
    fi
}
URI="$(find_debian_uri | head -n1)"
[ -n "$URI" ] || die "could not find a Debian archive entry in /etc/apt/sources.list.d/*.sources or /etc/apt/sources.list to take the mirror from; set LBS_REDIS_SERVER instead"

mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9   # one build at a time; a second caller waits, then finds the cache
for dir in $(ls -1 "$CACHE" 2>/dev/null | grep -E '^[0-9]+(\.[0-9]+)*$' | sort -rV); do
    if [ "$REBUILD" = 0 ] && good_enough "$CACHE/$dir/bin/redis-server"; then
        echo "$CACHE/$dir/bin/redis-server"; exit 0
    fi
done

WORK="$(mktemp -d "$CACHE/.build.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
APT_DIR="$CACHE/.apt"
mkdir -p "$APT_DIR/lists-$SUITE/partial"
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
cat >"$APT_DIR/$SUITE.sources" <<EOF
Types: deb-src
URIs: $URI
Suites: $SUITE
Components: main
$( [ -r "$KEYRING" ] && echo "Signed-By: $KEYRING" )
EOF
APT_OPTS=(
    -o "Dir::Etc::SourceList=$APT_DIR/$SUITE.sources"
    -o "Dir::Etc::SourceParts=$APT_DIR/none"
    -o "Dir::State::Lists=$APT_DIR/lists-$SUITE"
    -o "Debug::NoLocking=1"
    -o "APT::Sandbox::User=root"
)
log "[1/4] reading the source index of Debian's $SUITE suite from $URI (a few seconds)"
apt-get "${APT_OPTS[@]}" -qq update >&2 || die "apt-get update of the $SUITE source index failed"
# What will be downloaded, with sizes: one line per file, "'URL' NAME SIZE HASH".
FILES="$(apt-get "${APT_OPTS[@]}" -qq --print-uris source redis 2>/dev/null | awk '{print $2, $3}')" || true
[ -n "$FILES" ] || die "Debian's $SUITE suite lists no source package named redis"
TOTAL_KB="$(echo "$FILES" | awk '{s += $2} END {printf "%d", s / 1024}')"
log "[2/4] downloading the Redis source package ($(echo "$FILES" | awk '{printf "%s%s", sep, $1; sep=", "}'); $((TOTAL_KB / 1024)) MB)"
(cd "$WORK" && apt-get "${APT_OPTS[@]}" -qq source --download-only redis >&2) \
    || die "apt-get source --download-only redis failed"
ORIG="$(ls "$WORK"/redis_*.orig.tar.* 2>/dev/null | head -n1)"
[ -n "$ORIG" ] || die "the source package has no upstream tarball"
log "[3/4] unpacking $(basename "$ORIG")"
tar -xf "$ORIG" -C "$WORK"
SRC="$(find "$WORK" -maxdepth 1 -type d -name 'redis-*' | head -n1)"
[ -n "$SRC" ] || die "could not find the unpacked Redis sources in $WORK"

JOBS="$(nproc 2>/dev/null || echo 2)"
log "[4/4] building $(basename "$SRC") (its dependencies jemalloc, lua and hiredis, then redis-server) with make -j$JOBS: $BUILD_TIME_NOTE"
STARTED=$SECONDS
# In a session of its own, so an interrupted run stops the whole build (make and its compilers).
setsid make -C "$SRC" -j"$JOBS" >"$WORK/build.log" 2>&1 </dev/null &
MAKE_PID=$!
# (|| true: under set -e a failing command in the trap would turn a success into exit 1.)
trap 'kill -TERM -- "-$MAKE_PID" 2>/dev/null || true; wait "$MAKE_PID" 2>/dev/null || true; rm -rf "$WORK"' EXIT
trap 'exit 130' INT TERM
show_progress "$MAKE_PID" "$WORK/build.log"
wait "$MAKE_PID" || { tail -n 40 "$WORK/build.log" >&2; die "make failed (log above)"; }
BUILD_SECONDS=$((SECONDS - STARTED))
VERSION="$(server_version "$SRC/src/redis-server")"
good_enough "$SRC/src/redis-server" || die "Debian $SUITE carries Redis $VERSION, not $WANTED"

DEST="$CACHE/$VERSION"
rm -rf "$DEST.tmp" && mkdir -p "$DEST.tmp/bin"
for b in redis-server redis-cli redis-benchmark; do
    [ -x "$SRC/src/$b" ] && cp "$SRC/src/$b" "$DEST.tmp/bin/"
done
rm -rf "$DEST" && mv "$DEST.tmp" "$DEST"
log "built and cached Redis $VERSION in $DEST in $(mmss "$BUILD_SECONDS") (later runs find it there at once)"
echo "$DEST/bin/redis-server"
