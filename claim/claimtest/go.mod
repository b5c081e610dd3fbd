module github.com/oncekey/oncekey/claim/claimtest

go 1.26.0

require (
	github.com/alicebob/miniredis/v2 v2.40.0
	github.com/oncekey/oncekey v0.0.0-00010101000000-000000000000
	github.com/oncekey/oncekey/durable/sqlite v0.0.0-00010101000000-000000000000
	github.com/redis/go-redis/v9 v9.23.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/ncruces/go-sqlite3 v0.37.0 // indirect
	github.com/ncruces/go-sqlite3-wasm/v6 v6.5.35401 // indirect
	github.com/ncruces/julianday v1.0.0 // indirect
	github.com/yuin/gopher-lua v1.1.1 // indirect
	go.opentelemetry.io/otel v1.47.0 // indirect
	go.opentelemetry.io/otel/metric v1.47.0 // indirect
	go.opentelemetry.io/otel/trace v1.47.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
)

// Development and CI use the workspace (go.work) and these replaces; a
// release drops them and requires the tagged modules (RELEASING.md).
replace github.com/oncekey/oncekey => ../..

replace github.com/oncekey/oncekey/durable/sqlite => ../../durable/sqlite
