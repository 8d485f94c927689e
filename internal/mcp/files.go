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

// addFileTools adds the tools of a conversation's files.
func (s *Server) addFileTools() {
	AddTool(s, &mcpsdk.Tool{
		Name: "upload_file",
		Description: "Put a file into a conversation's /data, for programs to read. content_base64 is the file's bytes in base64. " +
			"Names are plain file names (letters, digits, '.', '_', '-').",
	}, ToolSpec{Destructive: true}, s.uploadFile)
	AddTool(s, &mcpsdk.Tool{
		Name:        "list_files",
		Description: "List the files in a conversation's /data, with sizes, types and download URLs.",
	}, ToolSpec{ReadOnly: true, Idempotent: true}, s.listFiles)
	AddTool(s, &mcpsdk.Tool{
		Name: "read_file",
		Description: "Return a file from a conversation's /data: images as images (to look at a chart), " +
			"text as text, anything else as a base64 resource; with its download URL.",
	}, ToolSpec{ReadOnly: true, Idempotent: true}, s.readFile)
	AddTool(s, &mcpsdk.Tool{
		Name:        "close_session",
		Description: "End a conversation: cancel its runs and delete its files.",
	}, ToolSpec{Destructive: true, Idempotent: true}, s.closeSession)
	AddTool(s, &mcpsdk.Tool{
		Name: "fork_conversation",
		Description: "Copy a conversation, to try several approaches from one point: each fork is a new conversation " +
			"with a copy of /data and the installed packages, and changes apart from the source from then on. " +
			"count makes up to 10 at once. A conversation with a run in progress is busy: fork it when the run has ended.",
	}, ToolSpec{}, s.forkConversation)
}

// ForkInput are fork_conversation's arguments.
type ForkInput struct {
	ConversationID    string `json:"conversationId" jsonschema:"the conversation to copy"`
	NewConversationID string `json:"new_conversation_id,omitempty" jsonschema:"the fork's id, with count 1; made when omitted"`
	Count             int    `json:"count,omitempty" jsonschema:"how many forks to make, 1 to 10 (default 1)"`
}

func (s *Server) forkConversation(ctx context.Context, in ForkInput) (conversations.Forks, error) {
	return s.convs.Fork(ctx, conversations.ForkRequest{ConversationID: in.ConversationID, NewID: in.NewConversationID, Count: in.Count})
}

// UploadFileInput are upload_file's arguments.
type UploadFileInput struct {
	ConversationID string `json:"conversationId,omitempty" jsonschema:"conversation to put the file in; made if omitted and returned"`
	SessionID      string `json:"session_id,omitempty" jsonschema:"another name for conversationId"`
	Filename       string `json:"filename" jsonschema:"plain file name, such as data.csv"`
	ContentBase64  string `json:"content_base64" jsonschema:"the file's bytes, base64-encoded"`
	Overwrite      bool   `json:"overwrite,omitempty" jsonschema:"replace a file of the same name (default false)"`
}

func (s *Server) uploadFile(ctx context.Context, in UploadFileInput) (Uploaded, error) {
	// Measured before decoding, so that an oversized upload costs nothing.
	limit := s.convs.Limits().MaxUpload
	if int64(len(in.ContentBase64)) > int64(base64.StdEncoding.EncodedLen(int(limit)))+2 {
		return Uploaded{}, runbox.Errorf(runbox.ETooLarge, "the file is larger than the limit of %d bytes", limit)
	}
	data, err := base64.StdEncoding.DecodeString(in.ContentBase64)
	if err != nil {
		return Uploaded{}, runbox.Errorf(runbox.EInvalid, "content_base64 is not valid base64")
	}
	up, err := s.convs.Upload(ctx, cmp.Or(in.ConversationID, in.SessionID), in.Filename, bytes.NewReader(data), in.Overwrite)
	if err != nil {
		return Uploaded{}, err
	}
	return uploaded(up, in.ConversationID != ""), nil
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

func (s *Server) listFiles(ctx context.Context, in ConversationInput) (FileList, error) {
	list, err := s.convs.List(ctx, in.id())
	if err != nil {
		return FileList{}, err
	}
	if list == nil {
		list = []runbox.FileInfo{}
	}
	return FileList{Files: list}, nil
}

// ReadFileInput are read_file's arguments.
type ReadFileInput struct {
	ConversationID string `json:"conversationId,omitempty" jsonschema:"the conversation"`
	SessionID      string `json:"session_id,omitempty" jsonschema:"another name for conversationId"`
	Name           string `json:"name,omitempty" jsonschema:"the file's name, as list_files gives it"`
	Path           string `json:"path,omitempty" jsonschema:"or its path under /data"`
}

// readFile answers the file's description, and the file itself as its
// content.
func (s *Server) readFile(ctx context.Context, in ReadFileInput) (Answer[runbox.FileInfo], error) {
	f, err := s.convs.Read(ctx, cmp.Or(in.ConversationID, in.SessionID), cmp.Or(in.Name, in.Path))
	if err != nil {
		return Answer[runbox.FileInfo]{}, err
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
	return Answer[runbox.FileInfo]{Value: f.FileInfo, Content: []mcpsdk.Content{c}}, nil
}

func (s *Server) closeSession(ctx context.Context, in ConversationInput) (Closed, error) {
	err := s.convs.Close(ctx, in.id())
	if errors.Is(err, conversations.ErrClosed) {
		// The PRD's code and words, which both kinds of client accept.
		return Closed{}, runbox.Errorf(runbox.ESessionNotFound, "No active session with id %s", in.id())
	}
	if err != nil {
		return Closed{}, err
	}
	return Closed{Status: "closed", ConversationID: in.id(), SessionID: in.id()}, nil
}
