#!/usr/bin/env bash
# Captures the exchanges 10-49 of testdata/syncgateway/3.1.0 from a real Sync
# Gateway 3.1.0 whose public interface is 127.0.0.1:4994 and admin interface
# 127.0.0.1:4995 (the replay tells them apart by port), for example:
#
#   .local/bin/sync_gateway shared/feed/testdata/syncgateway/3.1.0/sg-config.json &
#   bash shared/feed/testdata/syncgateway/capture-3.1.0.sh shared/feed/testdata/syncgateway/3.1.0
#
# It creates database db3 (sync function channel(doc.channels), user alice
# with channel orders), writes documents, and records each request with its
# raw answer in the format of the other captures. Revisions are
# deterministic, so a rerun on a fresh server writes the same files except
# for dates and multipart boundaries.
set -euo pipefail

OUT="${1:?usage: capture-3.1.0.sh OUTDIR}"
PUB=http://127.0.0.1:4994
ADM=http://127.0.0.1:4995
ALICE=(-u alice:alicepw)
BULK_ACCEPT='multipart/mixed, application/json;q=0.9'

# capture NAME METHOD URL [curl args...] writes OUT/NAME.txt.
capture() {
	local name="$1" method="$2" url="$3"
	shift 3
	{
		printf '### REQUEST: %s %s %s\n\n' "$method" "$url" "$*"
		curl -sS -i -X "$method" "$url" "$@"
	} >"$OUT/$name.txt"
	# The answer's status, for the caller.
	sed -n 's/^HTTP\/1.1 \([0-9]*\).*/\1/p' "$OUT/$name.txt" | head -n1
}

# body NAME prints the JSON body of a capture.
body() { python3 -c 'import sys; print(open(sys.argv[1], "rb").read().split(b"\r\n\r\n", 1)[1].decode())' "$OUT/$1.txt"; }
json() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
J=(-H 'Content-Type: application/json')

capture 10-admin-create-db3 PUT "$ADM/db3/" "${J[@]}" -d '{"server":"walrus:","bucket":"db3","num_index_replicas":0,"enable_shared_bucket_access":false,"sync":"function(doc, oldDoc){ channel(doc.channels); }"}' >/dev/null
capture 11-admin-user-alice PUT "$ADM/db3/_user/alice" "${J[@]}" -d '{"name":"alice","password":"alicepw","admin_channels":["orders"]}' >/dev/null

put() { # put NAME ID BODY [REV] prints the new rev
	local q=""
	[[ -n "${4:-}" ]] && q="?rev=$4"
	capture "$1" PUT "$ADM/db3/$2$q" "${J[@]}" -d "$3" >/dev/null
	body "$1" | json 'd["rev"]'
}
o1=$(put 12-put-o1 o1 '{"channels":["orders"],"n":1}')
o2=$(put 13-put-o2 o2 '{"channels":["orders"],"n":2}')
o3=$(put 14-put-o3 o3 '{"channels":["orders"],"n":3}')
e1=$(put 15-put-e1 e1 '{"channels":["eu"],"n":4}')
put 16-put-weird 'a%2Fb%20c%2Bd%C3%A9' '{"channels":["orders"],"n":5}' >/dev/null
o1b=$(put 17-update-o1 o1 '{"channels":["orders"],"n":11}' "$o1")
capture 18-delete-o2 DELETE "$ADM/db3/o2?rev=$o2" >/dev/null
o3b=$(put 19-move-o3-to-eu o3 '{"channels":["eu"],"n":33}' "$o3")
o2b=$(body 18-delete-o2 | json 'd["rev"]')

capture 20-changes-alice-include_docs GET "$PUB/db3/_changes?feed=longpoll&since=0&limit=100&include_docs=true&revocations=true&timeout=1000" "${ALICE[@]}" >/dev/null
capture 21-changes-alice-bulk GET "$PUB/db3/_changes?feed=longpoll&since=0&limit=100&revocations=true&timeout=1000" "${ALICE[@]}" >/dev/null
last=$(body 20-changes-alice-include_docs | json 'd["last_seq"]')

docs="{\"docs\":[{\"id\":\"o1\",\"rev\":\"$o1b\"},{\"id\":\"o1\",\"rev\":\"$o1\"},{\"id\":\"o2\",\"rev\":\"$o2b\"},{\"id\":\"o3\",\"rev\":\"$o3b\"},{\"id\":\"a/b c+dé\",\"rev\":\"1-57efedb8cf56edf401502d12c96aad80\"},{\"id\":\"nosuch\",\"rev\":\"1-abc\"},{\"id\":\"o1\",\"rev\":\"9-ffff\"}]}"
capture 22-bulk_get-alice POST "$PUB/db3/_bulk_get?revs=false" "${ALICE[@]}" "${J[@]}" -H "Accept: $BULK_ACCEPT" -d "$docs" >/dev/null
capture 23-bulk_get-alice-accept-json POST "$PUB/db3/_bulk_get?revs=false" "${ALICE[@]}" "${J[@]}" -H 'Accept: application/json' -d "$docs" >/dev/null

capture 24-get-deleted-o2 GET "$PUB/db3/o2" "${ALICE[@]}" -H 'Accept: application/json' >/dev/null
capture 25-get-deleted-o2-open_revs GET "$PUB/db3/o2?open_revs=all" "${ALICE[@]}" -H 'Accept: application/json' >/dev/null
capture 26-get-moved-o3 GET "$PUB/db3/o3" "${ALICE[@]}" -H 'Accept: application/json' >/dev/null
capture 27-get-moved-o3-open_revs GET "$PUB/db3/o3?open_revs=all" "${ALICE[@]}" -H 'Accept: application/json' >/dev/null
capture 28-get-nosuch GET "$PUB/db3/nosuch" "${ALICE[@]}" -H 'Accept: application/json' >/dev/null
capture 29-get-o1 GET "$PUB/db3/o1" "${ALICE[@]}" -H 'Accept: application/json' >/dev/null
capture 30-dbinfo-alice GET "$PUB/db3/" "${ALICE[@]}" -H 'Accept: application/json' >/dev/null

capture 31-admin-grant-eu PUT "$ADM/db3/_user/alice" "${J[@]}" -d '{"admin_channels":["orders","eu"]}' >/dev/null
since="$last"
for page in 32 33 34 35; do
	capture "$page-changes-alice-after-grant-limit1" GET "$PUB/db3/_changes?feed=longpoll&since=$since&limit=1&include_docs=true&revocations=true&timeout=1000" "${ALICE[@]}" >/dev/null
	since=$(body "$page-changes-alice-after-grant-limit1" | json 'd["last_seq"]')
done
granted="$since"

capture 36-admin-revoke-eu PUT "$ADM/db3/_user/alice" "${J[@]}" -d '{"admin_channels":["orders"]}' >/dev/null
capture 37-changes-alice-after-revoke-revocations GET "$PUB/db3/_changes?feed=longpoll&since=$granted&limit=100&include_docs=true&revocations=true&timeout=1000" "${ALICE[@]}" >/dev/null
capture 38-changes-alice-after-revoke-silent GET "$PUB/db3/_changes?feed=longpoll&since=$granted&limit=100&include_docs=true&timeout=1000" "${ALICE[@]}" >/dev/null
capture 39-get-revoked-e1 GET "$PUB/db3/e1" "${ALICE[@]}" -H 'Accept: application/json' >/dev/null
capture 40-get-revoked-e1-open_revs GET "$PUB/db3/e1?open_revs=all" "${ALICE[@]}" -H 'Accept: application/json' >/dev/null
echo "captured into $OUT (e1 $e1)" >&2
