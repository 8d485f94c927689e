package mcp

import (
	"bytes"
	"cmp"
	"context"
	"encoding/base64"
	"errors"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/conversations"
)

func addFileTools(s *Server) {
	mcpsdk.AddTool(s.sdk, s.describe(&mcpsdk.Tool{
		Name: "upload_file",
		Description: "Put a file into a conversation's /data, for programs to read. content_base64 is the file's bytes in base64. " +
			"Names are plain file names (letters, digits, '.', '_', '-').",
	}), s.uploadFile)
	mcpsdk.AddTool(s.sdk, s.describe(&mcpsdk.Tool{
		Name:        "list_files",
		Description: "List the files in a conversation's /data, with sizes, types and download URLs.",
	}), s.listFiles)
	mcpsdk.AddTool(s.sdk, s.describe(&mcpsdk.Tool{
		Name: "read_file",
		Description: "Return a file from a conversation's /data: images as images (to look at a chart), " +
			"text as text, anything else as a base64 resource; with its download URL.",
	}), s.readFile)
	mcpsdk.AddTool(s.sdk, s.describe(&mcpsdk.Tool{
		Name:        "close_session",
		Description: "End a conversation: cancel its runs and delete its files.",
	}), s.closeSession)
	mcpsdk.AddTool(s.sdk, s.describe(&mcpsdk.Tool{
		Name: "run_python",
		Description: "Run Python in a session's sandbox (the Python sandbox PRD's tool): files live in /mnt/data/. " +
			"Returns session_id, exit_code, stdout, stderr and the artifacts the run wrote, with download URLs.",
	}), s.runPython)
	mcpsdk.AddTool(s.sdk, s.describe(&mcpsdk.Tool{
		Name:        "read_artifact",
		Description: "Return a file of a session by its path under /mnt/data/, base64-encoded (images also as images).",
	}), s.readArtifact)
	mcpsdk.AddTool(s.sdk, s.describe(&mcpsdk.Tool{
		Name:        "list_artifacts",
		Description: "List the files in a session's /mnt/data/.",
	}), s.listArtifacts)
}

// UploadFileInput are upload_file's arguments.
type UploadFileInput struct {
	ConversationID string `json:"conversationId,omitempty" jsonschema:"conversation to put the file in; made if omitted and returned"`
	SessionID      string `json:"session_id,omitempty" jsonschema:"another name for conversationId"`
	Filename       string `json:"filename" jsonschema:"plain file name, such as data.csv"`
	ContentBase64  string `json:"content_base64" jsonschema:"the file's bytes, base64-encoded"`
	Overwrite      bool   `json:"overwrite,omitempty" jsonschema:"replace a file of the same name (default false)"`
}

func (s *Server) uploadFile(ctx context.Context, _ *mcpsdk.CallToolRequest, in UploadFileInput) (*mcpsdk.CallToolResult, any, error) {
	// Measured before decoding, so that an oversized upload costs nothing.
	limit := s.convs.Limits().MaxUpload
	if int64(len(in.ContentBase64)) > int64(base64.StdEncoding.EncodedLen(int(limit)))+2 {
		return s.toolError(ctx, runbox.Errorf(runbox.ETooLarge, "the file is larger than the limit of %d bytes", limit))
	}
	data, err := base64.StdEncoding.DecodeString(in.ContentBase64)
	if err != nil {
		return s.toolError(ctx, runbox.Errorf(runbox.EInvalid, "content_base64 is not valid base64"))
	}
	up, err := s.convs.Upload(ctx, cmp.Or(in.ConversationID, in.SessionID), in.Filename, bytes.NewReader(data), in.Overwrite)
	if err != nil {
		return s.toolError(ctx, err)
	}
	return nil, uploaded(up, in.ConversationID != ""), nil
}

// ConversationInput names a conversation.
type ConversationInput struct {
	ConversationID string `json:"conversationId,omitempty" jsonschema:"the conversation"`
	SessionID      string `json:"session_id,omitempty" jsonschema:"another name for conversationId"`
}

func (in ConversationInput) id() string { return cmp.Or(in.ConversationID, in.SessionID) }

// FileList is list_files' result.
type FileList struct {
	Files []runbox.FileInfo `json:"files"`
}

func (s *Server) listFiles(ctx context.Context, _ *mcpsdk.CallToolRequest, in ConversationInput) (*mcpsdk.CallToolResult, any, error) {
	list, err := s.convs.List(ctx, in.id())
	if err != nil {
		return s.toolError(ctx, err)
	}
	if list == nil {
		list = []runbox.FileInfo{}
	}
	return nil, FileList{Files: list}, nil
}

// ReadFileInput are read_file's arguments.
type ReadFileInput struct {
	ConversationID string `json:"conversationId,omitempty" jsonschema:"the conversation"`
	SessionID      string `json:"session_id,omitempty" jsonschema:"another name for conversationId"`
	Name           string `json:"name,omitempty" jsonschema:"the file's name, as list_files gives it"`
	Path           string `json:"path,omitempty" jsonschema:"or its path under /data"`
}

func (s *Server) readFile(ctx context.Context, _ *mcpsdk.CallToolRequest, in ReadFileInput) (*mcpsdk.CallToolResult, any, error) {
	f, err := s.convs.Read(ctx, cmp.Or(in.ConversationID, in.SessionID), cmp.Or(in.Name, in.Path))
	if err != nil {
		return s.toolError(ctx, err)
	}
	var c mcpsdk.Content
	switch f.Kind {
	case conversations.Image:
		c = &mcpsdk.ImageContent{Data: f.Data, MIMEType: f.ContentType}
	case conversations.Text:
		c = &mcpsdk.TextContent{Text: string(f.Data)}
	default:
		c = &mcpsdk.EmbeddedResource{Resource: &mcpsdk.ResourceContents{URI: f.URL, MIMEType: f.MimeType, Blob: f.Data}}
	}
	return &mcpsdk.CallToolResult{Content: []mcpsdk.Content{c}}, f.FileInfo, nil
}

func (s *Server) closeSession(ctx context.Context, _ *mcpsdk.CallToolRequest, in ConversationInput) (*mcpsdk.CallToolResult, any, error) {
	err := s.convs.Close(ctx, in.id())
	if errors.Is(err, conversations.ErrClosed) {
		// The PRD's code and words, which both kinds of client accept.
		return s.toolError(ctx, runbox.Errorf(runbox.ESessionNotFound, "No active session with id %s", in.id()))
	}
	if err != nil {
		return s.toolError(ctx, err)
	}
	return nil, Closed{Status: "closed", ConversationID: in.id(), SessionID: in.id()}, nil
}
