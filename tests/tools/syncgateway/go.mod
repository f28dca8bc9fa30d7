// The Sync Gateway build used by the tests: Couchbase Sync Gateway 3.1.0
// (Community Edition) as the Go module at the pseudo-version of its 3.1.0
// source, with Sync Gateway's own replace of graphql-go by its fork.
// localstack/syncgateway.sh builds it into .local/bin/sync_gateway.
// Change it with `go get -tool github.com/couchbase/sync_gateway@VERSION`;
// `go mod tidy` does not work here (it also wants the test-only and
// Enterprise dependencies, which the proxy does not serve).
module github.com/changes-worker/changes-worker/tests/tools/syncgateway

go 1.26.8

replace github.com/graphql-go/graphql v0.8.0 => github.com/couchbasedeps/graphql-go v0.8.1

tool github.com/couchbase/sync_gateway

require (
	github.com/aws/aws-sdk-go v1.44.77 // indirect
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/bhoriuchi/graphql-go-tools v1.0.0 // indirect
	github.com/cespare/xxhash/v2 v2.1.2 // indirect
	github.com/coreos/go-oidc v2.2.1+incompatible // indirect
	github.com/couchbase/blance v0.1.3 // indirect
	github.com/couchbase/cbauth v0.1.9 // indirect
	github.com/couchbase/cbgt v1.3.2-0.20230405201040-c0ede9925e46 // indirect
	github.com/couchbase/clog v0.1.0 // indirect
	github.com/couchbase/go-blip v0.0.0-20221021161139-215cbac22bd7 // indirect
	github.com/couchbase/go-couchbase v0.1.1 // indirect
	github.com/couchbase/gocb/v2 v2.6.2 // indirect
	github.com/couchbase/gocbcore/v10 v10.2.3-0.20230412164057-d9c465de8911 // indirect
	github.com/couchbase/gomemcached v0.1.4 // indirect
	github.com/couchbase/goutils v0.1.2 // indirect
	github.com/couchbase/sg-bucket v0.0.0-20230113211151-ac6a75f57046 // indirect
	github.com/couchbase/sync_gateway v0.0.0-20230424212843-2a9837d8971e // indirect
	github.com/couchbase/tools-common v0.0.0-20220810163003-4c3c185822d4 // indirect
	github.com/couchbaselabs/walrus v0.0.0-20230118190455-97ce18d0c47d // indirect
	github.com/davecgh/go-spew v1.1.1 // indirect
	github.com/elastic/gosigar v0.14.2 // indirect
	github.com/felixge/fgprof v0.9.2 // indirect
	github.com/go-ole/go-ole v1.2.6 // indirect
	github.com/golang/protobuf v1.5.2 // indirect
	github.com/golang/snappy v0.0.4 // indirect
	github.com/google/pprof v0.0.0-20211214055906-6f57359322fd // indirect
	github.com/google/uuid v1.3.0 // indirect
	github.com/gorilla/mux v1.8.0 // indirect
	github.com/graphql-go/graphql v0.8.0 // indirect
	github.com/imdario/mergo v0.3.12 // indirect
	github.com/json-iterator/go v1.1.12 // indirect
	github.com/klauspost/compress v1.15.12 // indirect
	github.com/matttproud/golang_protobuf_extensions v1.0.1 // indirect
	github.com/modern-go/concurrent v0.0.0-20180306012644-bacd9c7ef1dd // indirect
	github.com/modern-go/reflect2 v1.0.2 // indirect
	github.com/natefinch/lumberjack v2.0.0+incompatible // indirect
	github.com/opentracing/opentracing-go v1.2.0 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	github.com/pmezard/go-difflib v1.0.0 // indirect
	github.com/pquerna/cachecontrol v0.1.0 // indirect
	github.com/prometheus/client_golang v1.11.1 // indirect
	github.com/prometheus/client_model v0.2.0 // indirect
	github.com/prometheus/common v0.32.1 // indirect
	github.com/prometheus/procfs v0.7.3 // indirect
	github.com/rcrowley/go-metrics v0.0.0-20201227073835-cf1acfcdf475 // indirect
	github.com/robertkrimen/otto v0.0.0-20211024170158-b87d35c0b86f // indirect
	github.com/samuel/go-metrics v0.0.0-20150819231912-7ccf3e0e1fb1 // indirect
	github.com/shirou/gopsutil v3.21.11+incompatible // indirect
	github.com/stretchr/objx v0.5.0 // indirect
	github.com/stretchr/testify v1.8.2 // indirect
	github.com/youmark/pkcs8 v0.0.0-20201027041543-1326539a0a0a // indirect
	github.com/yusufpapurcu/wmi v1.2.2 // indirect
	golang.org/x/crypto v0.0.0-20220722155217-630584e8d5aa // indirect
	golang.org/x/exp v0.0.0-20220722155223-a9213eeb770e // indirect
	golang.org/x/net v0.0.0-20220919232410-f2f64ebce3c1 // indirect
	golang.org/x/oauth2 v0.0.0-20220718184931-c8730f7fcb92 // indirect
	golang.org/x/sys v0.0.0-20220728004956-3c1f35247d10 // indirect
	golang.org/x/text v0.4.0 // indirect
	google.golang.org/appengine v1.6.7 // indirect
	google.golang.org/protobuf v1.28.0 // indirect
	gopkg.in/couchbase/gocb.v1 v1.6.7 // indirect
	gopkg.in/couchbase/gocbcore.v7 v7.1.18 // indirect
	gopkg.in/couchbaselabs/gocbconnstr.v1 v1.0.4 // indirect
	gopkg.in/couchbaselabs/jsonx.v1 v1.0.1 // indirect
	gopkg.in/sourcemap.v1 v1.0.5 // indirect
	gopkg.in/square/go-jose.v2 v2.6.0 // indirect
	gopkg.in/yaml.v3 v3.0.1 // indirect
	nhooyr.io/websocket v1.8.7 // indirect
)
