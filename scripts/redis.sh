#!/usr/bin/env bash
# Print the path of a redis-server >= 8.4 on stdout (progress goes to stderr).
#
# Order of preference:
#   1. $LBS_REDIS_SERVER, if set (must be new enough, or this fails);
#   2. a redis-server on PATH that is new enough;
#   3. a build cached under ${XDG_CACHE_HOME:-~/.cache}/lbs/redis/<version>/;
#   4. a fresh build of Debian's source package of Redis (suite "experimental",
#      which carries 8.6), fetched from the same mirror as the machine's own
#      Debian entry, then cached as in 3.
#
# It never installs, starts or reconfigures the system's Redis and never edits
# /etc/apt: the experimental entry lives in a private sources file and the
# package lists in a private directory under the cache.
#
# Usage: scripts/redis.sh [--min-version 8.4] [--rebuild]
set -euo pipefail

MIN_VERSION="${LBS_REDIS_MIN_VERSION:-8.4}"
REBUILD=0
while [ $# -gt 0 ]; do
    case "$1" in
        --min-version) MIN_VERSION="$2"; shift 2 ;;
        --rebuild) REBUILD=1; shift ;;
        -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "redis.sh: unknown argument: $1" >&2; exit 2 ;;
    esac
done

CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/lbs/redis"
log() { echo "redis.sh: $*" >&2; }
die() { echo "redis.sh: error: $*" >&2; exit 1; }

# "Redis server v=8.6.3 sha=..." -> 8.6.3
server_version() { "$1" --version 2>/dev/null | sed -n 's/.* v=\([0-9][0-9.]*\).*/\1/p'; }

# version_ge A B: true when dotted version A >= B
version_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]; }

good_enough() {
    local bin="$1" v
    [ -x "$bin" ] || return 1
    v="$(server_version "$bin")"
    [ -n "$v" ] && version_ge "$v" "$MIN_VERSION"
}

if [ -n "${LBS_REDIS_SERVER:-}" ]; then
    good_enough "$LBS_REDIS_SERVER" \
        || die "LBS_REDIS_SERVER=$LBS_REDIS_SERVER is not a redis-server >= $MIN_VERSION"
    echo "$LBS_REDIS_SERVER"; exit 0
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
command -v apt-get >/dev/null || die "no redis-server >= $MIN_VERSION found and apt-get is missing, so it cannot be built; set LBS_REDIS_SERVER to one"
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
mkdir -p "$APT_DIR/lists/partial"
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
cat >"$APT_DIR/experimental.sources" <<EOF
Types: deb-src
URIs: $URI
Suites: experimental
Components: main
$( [ -r "$KEYRING" ] && echo "Signed-By: $KEYRING" )
EOF
APT_OPTS=(
    -o "Dir::Etc::SourceList=$APT_DIR/experimental.sources"
    -o "Dir::Etc::SourceParts=$APT_DIR/none"
    -o "Dir::State::Lists=$APT_DIR/lists"
    -o "Debug::NoLocking=1"
    -o "APT::Sandbox::User=root"
)
log "fetching the Redis source package from $URI (suite experimental)"
apt-get "${APT_OPTS[@]}" -qq update >&2 || die "apt-get update of the experimental source index failed"
(cd "$WORK" && apt-get "${APT_OPTS[@]}" -qq source --download-only redis >&2) \
    || die "apt-get source --download-only redis failed"
ORIG="$(ls "$WORK"/redis_*.orig.tar.* 2>/dev/null | head -n1)"
[ -n "$ORIG" ] || die "the source package has no upstream tarball"
tar -xf "$ORIG" -C "$WORK"
SRC="$(find "$WORK" -maxdepth 1 -type d -name 'redis-*' | head -n1)"
[ -n "$SRC" ] || die "could not find the unpacked Redis sources in $WORK"

JOBS="$(nproc 2>/dev/null || echo 2)"
log "building $(basename "$SRC") with make -j$JOBS (about a minute on 2 cores)"
make -C "$SRC" -j"$JOBS" >"$WORK/build.log" 2>&1 \
    || { tail -n 40 "$WORK/build.log" >&2; die "make failed (log above)"; }
VERSION="$(server_version "$SRC/src/redis-server")"
version_ge "$VERSION" "$MIN_VERSION" \
    || die "Debian experimental carries Redis $VERSION, older than $MIN_VERSION"

DEST="$CACHE/$VERSION"
rm -rf "$DEST.tmp" && mkdir -p "$DEST.tmp/bin"
for b in redis-server redis-cli redis-benchmark; do
    [ -x "$SRC/src/$b" ] && cp "$SRC/src/$b" "$DEST.tmp/bin/"
done
rm -rf "$DEST" && mv "$DEST.tmp" "$DEST"
log "cached Redis $VERSION in $DEST"
echo "$DEST/bin/redis-server"
