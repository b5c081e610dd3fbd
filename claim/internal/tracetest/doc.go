// Package tracetest holds the tests of package claim's traces
// (claim.WithTracerProvider), against the OpenTelemetry SDK's in-memory
// exporter. It is a module of its own, with tests only, so that the SDK
// never enters the module graph of the library's users.
package tracetest
