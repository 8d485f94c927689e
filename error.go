package runbox

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Error codes, as clients see them in {error, message}.
const (
	EInvalid          = "invalid_argument"
	EUnknownLanguage  = "unknown_language"
	EInvalidPath      = "invalid_path"
	ENotFound         = "not_found"
	EFileExists       = "file_exists"
	ETooLarge         = "too_large"
	EArtifactTooLarge = "artifact_too_large"
	EQuotaExceeded    = "quota_exceeded"
	EBusy             = "busy"
	ERateLimited      = "rate_limited"
	EUnavailable      = "unavailable"
	EUnauthorized     = "unauthorized"
	EForbidden        = "forbidden"         // a request from a web origin the server does not accept
	ESessionNotFound  = "session_not_found" // the Python sandbox PRD's not_found for a conversation
	EEgressDenied     = "egress_denied"     // a run asked to reach a domain its client may not
	EInternal         = "internal"
	// ENotListening: no process of the conversation listens on the port a
	// preview was asked for.
	ENotListening = "not_listening"
	// ETemplateUnavailable: a project template this installation lacks.
	ETemplateUnavailable = "template_unavailable"
	// EUnsupported: a setting the service cannot enforce, so it refuses
	// it rather than ignore it.
	EUnsupported = "unsupported"
	// ETooManyExecutions: a session, or the server, runs as many commands
	// (execute_code) as it may at once.
	ETooManyExecutions = "too_many_executions"
	// EMaxSessions: the Python sandbox PRD's refusal of a new
	// conversation past SANDBOX_MAX_SESSIONS.
	EMaxSessions = "max_sessions"
	// EConversationExists: a conversation was to be made (a fork) under an
	// id its client uses already.
	EConversationExists = "conversation_exists"
)

// The security gateway's codes, which its tools (the git and project
// tools) answer with, as its clients expect them.
const (
	EInvalidRepo       = "INVALID_REPO"
	EInvalidBranch     = "INVALID_BRANCH"
	EPathTraversal     = "PATH_TRAVERSAL"
	EFileSizeExceeded  = "FILE_SIZE_EXCEEDED"
	EGitHubAuthFailed  = "GITHUB_AUTH_FAILED"
	EPermissionDenied  = "PERMISSION_DENIED"
	ERateLimitExceeded = "RATE_LIMIT_EXCEEDED"
	EGatewayQuota      = "QUOTA_EXCEEDED"
	// The project tools' own.
	ESandboxNotFound = "SANDBOX_NOT_FOUND"
	ESandboxTimeout  = "SANDBOX_TIMEOUT"
)

// Error is an error a client may see: a code and one sentence that names no
// host path and no secret. Anything else that reaches an edge is reported as
// EInternal and logged.
type Error struct {
	Code    string
	Message string
	// RetryAfter, for rate_limited and quota_exceeded, is when the client
	// may try again.
	RetryAfter time.Duration
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// Errorf returns an *Error with a formatted message.
func Errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// ErrorCode returns the code of the first *Error in err's chain, or
// EInternal.
func ErrorCode(err error) string {
	if e, ok := errors.AsType[*Error](err); ok {
		return e.Code
	}
	return EInternal
}

// ErrorMessage returns the client-safe message of err.
func ErrorMessage(err error) string {
	if e, ok := errors.AsType[*Error](err); ok {
		return e.Message
	}
	return "internal error"
}

// Limited returns a rate_limited or quota_exceeded error that tells the
// client when to come back.
func Limited(code string, retryAfter time.Duration, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...), RetryAfter: retryAfter}
}

// RetryAfterSeconds returns the whole seconds (at least 1) after which the
// client may retry err, or 0 when err says nothing of it.
func RetryAfterSeconds(err error) int {
	e, ok := errors.AsType[*Error](err)
	if !ok || e.RetryAfter <= 0 {
		return 0
	}
	return max(1, int(math.Ceil(e.RetryAfter.Seconds())))
}
