package mcp

import (
	"cmp"
	"context"
	"encoding/base64"
	"fmt"
	"path"
	"strings"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/conversations"
	"github.com/runbox-dev/runbox/internal/runs"
)

// The Python sandbox PRD (SEED-CONTRACTS.md) has clients of its own:
// run_python, read_artifact and list_artifacts answer in its shapes only,
// with paths under /mnt/data (the same folder as /data); upload_file and
// close_session, which both kinds of client call, answer with both names
// of each field.

const mntData = "/mnt/data/"

// addPRDTools adds the PRD's own tools, which speak its dialect.
func (s *Server) addPRDTools() {
	AddTool(s, &mcpsdk.Tool{
		Name: "run_python",
		Description: "Run Python in a session's sandbox (the Python sandbox PRD's tool): files live in /mnt/data/. " +
			"Returns session_id, exit_code, stdout, stderr and the artifacts the run wrote, with download URLs.",
	}, ToolSpec{Destructive: true, Dialect: prd}, s.runPython)
	AddTool(s, &mcpsdk.Tool{
		Name:        "read_artifact",
		Description: "Return a file of a session by its path under /mnt/data/, base64-encoded (images also as images).",
	}, ToolSpec{ReadOnly: true, Idempotent: true, Dialect: prd}, s.readArtifact)
	AddTool(s, &mcpsdk.Tool{
		Name:        "list_artifacts",
		Description: "List the files in a session's /mnt/data/.",
	}, ToolSpec{ReadOnly: true, Idempotent: true, Dialect: prd}, s.listArtifacts)
}

// PRDArtifact is a file as the PRD describes it.
type PRDArtifact struct {
	Path        string `json:"path"`
	Filename    string `json:"filename"`
	SizeBytes   int64  `json:"size_bytes"`
	MimeType    string `json:"mime_type"`
	DownloadURL string `json:"download_url,omitempty"`
}

func prdArtifact(f runbox.FileInfo, withURL bool) PRDArtifact {
	a := PRDArtifact{Path: mntData + f.Name, Filename: path.Base(f.Name), SizeBytes: f.SizeBytes, MimeType: f.MimeType}
	if withURL {
		a.DownloadURL = f.URL
	}
	return a
}

// RunPythonInput are run_python's arguments.
type RunPythonInput struct {
	SessionID string `json:"session_id,omitempty" jsonschema:"the session; made and returned when omitted"`
	Code      string `json:"code" jsonschema:"Python source, at most 100 KB; files live in /mnt/data/"`
}

// RunPythonOutput is run_python's result.
type RunPythonOutput struct {
	SessionID       string        `json:"session_id"`
	RunID           string        `json:"run_id"`
	ExitCode        int           `json:"exit_code"`
	Stdout          string        `json:"stdout"`
	Stderr          string        `json:"stderr"`
	StdoutTruncated bool          `json:"stdout_truncated"`
	StderrTruncated bool          `json:"stderr_truncated"`
	Artifacts       []PRDArtifact `json:"artifacts"`
	DurationMS      int64         `json:"duration_ms"`
}

// runPython answers in the PRD's shape, with the new charts as images.
func (s *Server) runPython(ctx context.Context, in RunPythonInput) (Answer[RunPythonOutput], error) {
	sid := cmp.Or(in.SessionID, runs.NewConversationID())
	res, err := s.run(ctx, runs.Request{Language: "python", Code: in.Code, ConversationID: sid})
	if err != nil {
		return Answer[RunPythonOutput]{}, err
	}
	out := RunPythonOutput{
		SessionID: sid, RunID: res.RunID, ExitCode: res.ExitCode, Stdout: res.Stdout, Stderr: res.Stderr,
		StdoutTruncated: res.StdoutTruncated, StderrTruncated: res.StderrTruncated, Artifacts: []PRDArtifact{},
		DurationMS: res.DurationMS,
	}
	if res.TimedOut {
		// The PRD's words, after whatever the program wrote.
		out.ExitCode = -1
		if out.Stderr != "" && !strings.HasSuffix(out.Stderr, "\n") {
			out.Stderr += "\n"
		}
		out.Stderr += fmt.Sprintf("Execution timed out after %d seconds", s.runs.Limits().MaxTimeoutSeconds)
	}
	// Artifacts are what a successful run made or changed.
	if res.ExitCode == 0 && !res.TimedOut {
		for _, a := range res.Artifacts {
			out.Artifacts = append(out.Artifacts, prdArtifact(a, true))
		}
	}
	var images []mcpsdk.Content
	for _, img := range s.convs.Images(ctx, sid, res.Artifacts) {
		images = append(images, &mcpsdk.ImageContent{Data: img.Data, MIMEType: img.ContentType})
	}
	return Answer[RunPythonOutput]{Value: out, Content: images}, nil
}

// ReadArtifactInput are read_artifact's arguments.
type ReadArtifactInput struct {
	SessionID string `json:"session_id" jsonschema:"the session"`
	Path      string `json:"path" jsonschema:"the file's absolute path, under /mnt/data/"`
}

// ReadArtifactOutput is read_artifact's result.
type ReadArtifactOutput struct {
	Path          string `json:"path"`
	Filename      string `json:"filename"`
	MimeType      string `json:"mime_type"`
	SizeBytes     int64  `json:"size_bytes"`
	ContentBase64 string `json:"content_base64"`
}

// readArtifact answers the file in base64, and an image as an image too.
func (s *Server) readArtifact(ctx context.Context, in ReadArtifactInput) (Answer[ReadArtifactOutput], error) {
	if in.SessionID == "" {
		return Answer[ReadArtifactOutput]{}, runbox.Errorf(runbox.EInvalid, "session_id is required")
	}
	f, err := s.convs.Read(ctx, in.SessionID, in.Path)
	if runbox.ErrorCode(err) == runbox.ENotFound {
		// The PRD's words. A file too large to return is the PRD's
		// artifact_too_large, in its shape (the dialect's).
		err = runbox.Errorf(runbox.ENotFound, "No artifact at %s%s", mntData, strings.TrimPrefix(strings.TrimPrefix(in.Path, mntData), "/data/"))
	}
	if err != nil {
		return Answer[ReadArtifactOutput]{}, err
	}
	out := ReadArtifactOutput{Path: mntData + f.Name, Filename: path.Base(f.Name), MimeType: f.MimeType, SizeBytes: f.SizeBytes,
		ContentBase64: base64.StdEncoding.EncodeToString(f.Data)}
	var image []mcpsdk.Content
	if f.Kind == conversations.Image {
		image = []mcpsdk.Content{&mcpsdk.ImageContent{Data: f.Data, MIMEType: f.ContentType}}
	}
	return Answer[ReadArtifactOutput]{Value: out, Content: image}, nil
}

// SessionInput names a PRD session.
type SessionInput struct {
	SessionID string `json:"session_id" jsonschema:"the session"`
}

// ArtifactList is list_artifacts' result.
type ArtifactList struct {
	Artifacts []PRDArtifact `json:"artifacts"`
}

func (s *Server) listArtifacts(ctx context.Context, in SessionInput) (ArtifactList, error) {
	list, err := s.convs.List(ctx, in.SessionID)
	if err != nil {
		return ArtifactList{}, err
	}
	out := ArtifactList{Artifacts: []PRDArtifact{}}
	for _, f := range list {
		out.Artifacts = append(out.Artifacts, prdArtifact(f, false))
	}
	return out, nil
}

// Uploaded is upload_file's result, in runbox's names and the PRD's.
type Uploaded struct {
	ConversationID string `json:"conversationId"`
	SessionID      string `json:"session_id"`
	Name           string `json:"name"`
	Filename       string `json:"filename"`
	Path           string `json:"path"`
	SizeBytes      int64  `json:"size_bytes"`
	MimeType       string `json:"mime_type"`
	URL            string `json:"url"`
	DownloadURL    string `json:"download_url"`
}

func uploaded(up conversations.Uploaded, namedConversation bool) Uploaded {
	p := mntData + up.Name
	if namedConversation {
		p = up.Path
	}
	return Uploaded{ConversationID: up.ConversationID, SessionID: up.ConversationID, Name: up.Name, Filename: path.Base(up.Name),
		Path: p, SizeBytes: up.SizeBytes, MimeType: up.MimeType, URL: up.URL, DownloadURL: up.URL}
}

// Closed is close_session's result, in runbox's names and the PRD's.
type Closed struct {
	Status         string `json:"status"`
	ConversationID string `json:"conversationId"`
	SessionID      string `json:"session_id"`
}
