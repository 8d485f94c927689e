package sandbox

import (
	"context"
	"testing"
	"time"
)

// BenchmarkWarmRun measures a run in a conversation's warm sandbox, from
// Run to the program's exit: print(1) in each language.
func BenchmarkWarmRun(b *testing.B) {
	for _, lang := range []struct{ name, code string }{
		{"python", "print(1)"}, {"bash", "echo 1"}, {"typescript", "console.log(1)"},
	} {
		b.Run(lang.name, func(b *testing.B) {
			m, _ := newManager(b, defaultLimits)
			dir := b.TempDir()
			run := func() {
				if _, err := m.Run(context.Background(), Request{RunID: "b", ConversationID: "bench", Language: lang.name,
					Code: lang.code, Timeout: 30 * time.Second, DataDir: dir}, func(Stream, []byte) {}); err != nil {
					b.Fatal(err)
				}
			}
			run()
			time.Sleep(3 * time.Second) // the zygote gets ready
			run()
			b.ResetTimer()
			for b.Loop() {
				run()
			}
		})
	}
}
