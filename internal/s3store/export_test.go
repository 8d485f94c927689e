package s3store

import (
	"context"
	"strings"

	"github.com/minio/minio-go/v7"
)

// What the package's tests use of its insides. They are outside it:
// testenv, which they use, imports it.

const MaxSpooling = maxSpooling

// PutForeign puts an object of one byte under key, as anyone with access
// to the bucket could.
func (s *Store) PutForeign(ctx context.Context, key string) error {
	_, err := s.mc.PutObject(ctx, s.bucket, key, strings.NewReader("x"), 1, minio.PutObjectOptions{})
	return err
}
