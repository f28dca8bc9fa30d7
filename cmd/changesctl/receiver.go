package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/changes-worker/changes-worker/shared/demo/receiver"
)

// cmdReceiver serves the reference HTTP receiver (the demo's REST endpoint).
func cmdReceiver(ctx context.Context, env *cliEnv, args []string) error {
	fs := newFlags(env, "receiver")
	addr := fs.String("addr", "127.0.0.1:8099", "listen address")
	dir := fs.String("dir", ".local/http-out", "directory receiving one JSON file per document")
	if err := fs.Parse(args); err != nil {
		return err
	}
	s, err := receiver.New(*dir)
	if err != nil {
		return err
	}
	srv := &http.Server{Addr: *addr, Handler: s, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: time.Minute}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	fmt.Fprintf(env.stderr, "receiver on http://%s/docs/{id}, storing in %s\n", *addr, *dir)
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve receiver: %w", err)
	}
	return nil
}
