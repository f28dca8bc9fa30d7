package pipeline

import (
	"context"
	"fmt"
	"net/http"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deliver"
	"github.com/changes-worker/changes-worker/shared/deliver/httpsink"
	"github.com/changes-worker/changes-worker/shared/deliver/pgsink"
	"github.com/changes-worker/changes-worker/shared/deliver/s3sink"
	"github.com/changes-worker/changes-worker/shared/verify"
)

var (
	_ verify.Output = (*pgsink.State)(nil)
	_ verify.Output = (*s3sink.State)(nil)
)

// NoStateError is returned by State for an output whose type keeps no state
// that could be read back.
type NoStateError struct {
	Type   string // the output's type
	Reason string // why it has none
}

func (e *NoStateError) Error() string {
	return fmt.Sprintf("%s output has no state to read: %s", e.Type, e.Reason)
}

// implementation is what an output's type selects: how to open its sink and,
// for an output that keeps state, its state reader.
type implementation struct {
	sink  func(context.Context, *config.Output) (deliver.Sink, error)
	state func(context.Context, *config.Output) (verify.Output, error) // nil: no state
	// noState says why an output without a state reader has none.
	noState string
}

// implementation is the one place where an output's type selects the
// packages that serve it.
func (d *Deps) implementation(o *config.Output) (implementation, error) {
	switch {
	case o.Postgres != nil:
		return implementation{sink: d.postgresSink, state: d.postgresState}, nil
	case o.HTTP != nil:
		return implementation{sink: d.httpSink, noState: "an HTTP endpoint exposes no state to compare"}, nil
	case o.S3 != nil:
		return implementation{sink: d.s3Sink, state: d.s3State}, nil
	}
	return implementation{}, fmt.Errorf("output %s has no settings", o.ID)
}

// State opens the state reader of an output: what it holds, as its sink
// reports it. It creates no table. For an output that keeps no state (http)
// the error is a *NoStateError.
func (d *Deps) State(ctx context.Context, o *config.Output) (verify.Output, error) {
	impl, err := d.implementation(o)
	if err != nil {
		return nil, err
	}
	if impl.state == nil {
		return nil, &NoStateError{Type: o.Type, Reason: impl.noState}
	}
	return impl.state(ctx, o)
}

func (d *Deps) postgresSink(ctx context.Context, o *config.Output) (deliver.Sink, error) {
	pool, err := d.Pool(ctx, o.Postgres)
	if err != nil {
		return nil, err
	}
	s, err := pgsink.New(pool, *o.Postgres, o.ID)
	if err != nil {
		return nil, err
	}
	if o.Postgres.CreateTables {
		if err := s.CreateTables(ctx); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func (d *Deps) postgresState(ctx context.Context, o *config.Output) (verify.Output, error) {
	pool, err := d.Pool(ctx, o.Postgres)
	if err != nil {
		return nil, err
	}
	return asOutput(pgsink.NewState(pool, *o.Postgres, o.ID))
}

func (d *Deps) httpSink(ctx context.Context, o *config.Output) (deliver.Sink, error) {
	creds, err := d.httpCredentials(ctx, o.HTTP)
	if err != nil {
		return nil, err
	}
	return httpsink.New(*o.HTTP, creds, &http.Client{})
}

func (d *Deps) s3Sink(_ context.Context, o *config.Output) (deliver.Sink, error) {
	return s3sink.New(d.S3, *o.S3)
}

func (d *Deps) s3State(_ context.Context, o *config.Output) (verify.Output, error) {
	return asOutput(s3sink.NewState(d.S3, *o.S3))
}

// asOutput returns st as a verify.Output, nil on an error (never an
// interface holding a nil pointer).
func asOutput[T verify.Output](st T, err error) (verify.Output, error) {
	if err != nil {
		return nil, err
	}
	return st, nil
}

// httpCredentials resolves every secret reference of an HTTP output: auth,
// the headers given by reference and url_secret.
func (d *Deps) httpCredentials(ctx context.Context, h *config.HTTPOutput) (httpsink.Credentials, error) {
	var creds httpsink.Credentials
	if a := h.Auth; a != nil {
		var err error
		if creds.Username, creds.Password, creds.Token, err = d.credentials(ctx, a); err != nil {
			return creds, fmt.Errorf("http auth: %w", err)
		}
	}
	for name, v := range h.Headers {
		if v.Ref == nil {
			continue
		}
		val, err := d.Secrets.Resolve(ctx, *v.Ref)
		if err != nil {
			return creds, fmt.Errorf("http header %s: %w", name, err)
		}
		if creds.Headers == nil {
			creds.Headers = map[string]string{}
		}
		creds.Headers[name] = val
	}
	if h.URLSecret != nil {
		val, err := d.Secrets.Resolve(ctx, *h.URLSecret)
		if err != nil {
			return creds, fmt.Errorf("http url_secret: %w", err)
		}
		creds.URLSecret = val
	}
	return creds, nil
}
