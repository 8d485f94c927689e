package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"strings"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/conversations"
)

// ToolError is the body of a failed tool call.
type ToolError struct {
	Error   string `json:"error"`
	Message string `json:"message"`
	// URL downloads a file too large to return inline.
	URL string `json:"url,omitempty"`
	// RetryAfterSeconds tells a limited client when to come back.
	RetryAfterSeconds int `json:"retry_after_seconds,omitempty"`
	// Available lists what there is instead of what was asked for (the
	// templates of a project's template_unavailable).
	Available []string `json:"available,omitempty"`
}

// PRDError is a tool error in the PRD's shape.
type PRDError struct {
	Error       string `json:"error"`
	Message     string `json:"message"`
	SizeBytes   int64  `json:"size_bytes,omitempty"`
	DownloadURL string `json:"download_url,omitempty"`
}

// Dialect is how a family's tools word their errors, for clients written
// to another specification than runbox's. The zero Dialect is runbox's
// own; Gateway is the security gateway's; prd is the Python sandbox
// PRD's.
type Dialect struct {
	// codes renames runbox's codes; a code it does not name is kept.
	codes map[string]string
	// prdShape: a file too large to return inline is told in the PRD's
	// shape (size_bytes, download_url), not in runbox's (url).
	prdShape bool
}

// gatewayCodes are runbox's codes as the security gateway names them, in
// the errors of every family of its tools.
var gatewayCodes = map[string]string{
	runbox.ERateLimited:   runbox.ERateLimitExceeded,
	runbox.EQuotaExceeded: runbox.EGatewayQuota,
	runbox.ETooLarge:      runbox.EFileSizeExceeded,
	runbox.EInvalidPath:   runbox.EPathTraversal,
}

// Gateway is the security gateway's dialect, with the names a family of
// its tools gives further codes (own, which win).
func Gateway(own map[string]string) Dialect {
	codes := maps.Clone(gatewayCodes)
	maps.Copy(codes, own)
	return Dialect{codes: codes}
}

// prd is the dialect of the Python sandbox PRD's own tools.
var prd = Dialect{prdShape: true}

// body is err as a tool error's body in d.
func (d Dialect) body(err error) any {
	code := runbox.ErrorCode(err)
	if renamed, ok := d.codes[code]; ok {
		code = renamed
	}
	tl, tooLarge := errors.AsType[*conversations.TooLargeError](err)
	if tooLarge && d.prdShape {
		return PRDError{Error: code, Message: runbox.ErrorMessage(err), SizeBytes: tl.Size, DownloadURL: tl.URL}
	}
	body := ToolError{Error: code, Message: runbox.ErrorMessage(err), RetryAfterSeconds: runbox.RetryAfterSeconds(err)}
	if tooLarge {
		body.URL = tl.URL
	}
	if c, ok := errors.AsType[choices](err); ok {
		body.Available = c.Available()
	}
	return body
}

// choices is an error that says what there is instead.
type choices interface {
	error
	Available() []string
}

// toolError turns err into an isError result in dialect d. Unexpected
// errors are logged and reported without detail.
func (s *Server) toolError(ctx context.Context, d Dialect, err error) (*mcpsdk.CallToolResult, any, error) {
	if runbox.ErrorCode(err) == runbox.EInternal {
		if errors.Is(err, context.Canceled) || ctx.Err() != nil {
			return nil, nil, err // the client went away; nobody reads this
		}
		s.log.Error("tool failed", "err", err)
	}
	return errorResult(d.body(err)), nil, nil
}

// structuredErrors gives the tool errors the SDK makes itself (arguments
// that do not match a tool's schema) the shape of every other: a JSON
// {error, message} as the text and the structured content, which
// clients that parse content[0].text rely on.
func structuredErrors(next mcpsdk.MethodHandler) mcpsdk.MethodHandler {
	return func(ctx context.Context, method string, req mcpsdk.Request) (mcpsdk.Result, error) {
		res, err := next(ctx, method, req)
		if tr, ok := res.(*mcpsdk.CallToolResult); ok && err == nil && tr.IsError && tr.StructuredContent == nil {
			var parts []string
			for _, c := range tr.Content {
				if t, ok := c.(*mcpsdk.TextContent); ok {
					parts = append(parts, t.Text)
				}
			}
			return errorResult(ToolError{Error: runbox.EInvalid, Message: strings.Join(parts, "; ")}), nil
		}
		return res, err
	}
}

// errorResult is a tool error with body as its text and structured
// content.
func errorResult(body any) *mcpsdk.CallToolResult {
	b, _ := json.Marshal(body)
	return &mcpsdk.CallToolResult{
		IsError:           true,
		Content:           []mcpsdk.Content{&mcpsdk.TextContent{Text: string(b)}},
		StructuredContent: body,
	}
}
