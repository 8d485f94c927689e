package main

import (
	"testing"

	"github.com/runbox-dev/runbox/internal/agent"
)

func TestReadLimits(t *testing.T) {
	tests := []struct {
		name    string
		env     map[string]string
		want    limits
		wantErr bool
	}{
		{name: "none", env: nil, want: limits{}},
		{name: "all", env: map[string]string{"RUNBOX_FILE_SIZE": "1048576", "RUNBOX_QUOTA_BYTES": "2097152", "RUNBOX_QUOTA_FILES": "20000"},
			want: limits{fileSize: 1 << 20, quota: agent.Quota{Bytes: 2 << 20, Entries: 20000}}},
		{name: "zero", env: map[string]string{"RUNBOX_QUOTA_FILES": "0"}, wantErr: true},
		{name: "not a number", env: map[string]string{"RUNBOX_FILE_SIZE": "1m"}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := readLimits(func(k string) string { return tt.env[k] })
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Errorf("readLimits: %+v, %v; want %+v (error: %v)", got, err, tt.want, tt.wantErr)
			}
		})
	}
}
