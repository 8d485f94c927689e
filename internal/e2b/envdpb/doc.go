// Package envdpb holds the code generated from runbox's .proto files of
// the E2B sandbox daemon's services (internal/e2b/proto): the messages
// (process, filesystem) and their Connect-RPC handlers and clients
// (processpbconnect, filesystempbconnect). None of it is edited by hand.
package envdpb

// buf and the plugins come from the Go module proxy (protoc-gen-go and
// protoc-gen-connect-go at go.mod's versions): nothing else is needed.
//go:generate sh -c "cd ../proto && go run github.com/bufbuild/buf/cmd/buf@v1.75.0 generate"
