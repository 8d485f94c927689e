package executor

import (
	"context"

	"github.com/runbox-dev/runbox/internal/files"
	"github.com/runbox-dev/runbox/internal/link"
)

// The executor is the api's way to the sandboxes it holds (link.Backend):
// streams to their ports, files written into a running project, the
// recent output of background runs.

// WriteFiles writes files into a conversation's folder here, which its
// sandboxes mount; with a remote file store, into the working copy and
// then the store, so that the next run anywhere finds them.
func (e *Executor) WriteFiles(ctx context.Context, conv string, fs []link.File) error {
	var before []files.Entry
	if e.cfg.Copies != nil {
		var err error
		if before, err = e.folders.List(conv); err != nil {
			return err
		}
	}
	put := make([]files.PutFile, len(fs))
	for i, f := range fs {
		put[i] = files.PutFile{Name: f.Path, Data: f.Data}
	}
	if err := e.folders.Put(conv, put); err != nil {
		return err
	}
	if c := e.cfg.Copies; c != nil {
		after, err := e.folders.List(conv)
		if err != nil {
			return err
		}
		return c.Push(ctx, conv, before, after)
	}
	return nil
}

// Output returns the recent output of a background run running here.
func (e *Executor) Output(run string) (link.Output, bool) { return e.tails.get(run) }
