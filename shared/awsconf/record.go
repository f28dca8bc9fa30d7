package awsconf

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	"github.com/aws/smithy-go/middleware"

	"github.com/changes-worker/changes-worker/shared/iampolicy"
)

// EnvCalls names a file to which the clients of Load append a record of
// every AWS request made by a known caller (a Call per line, JSON): a
// Lambda function (AWS_LAMBDA_FUNCTION_NAME) or a context labelled by
// WithCaller. The tests set it to check each request against the IAM
// policy of its caller. Unset or empty, nothing is added to the clients.
const EnvCalls = "CHANGES_AWS_CALLS"

// Call is one AWS request as recorded: who made it, the SDK operation, and
// what IAM authorises for it.
type Call struct {
	// Caller is the Lambda function's name, or the label of WithCaller
	// ("changesctl status").
	Caller    string `json:"caller"`
	Service   string `json:"service"` // the SDK's service id: SQS, DynamoDB, S3, ...
	Operation string `json:"operation"`
	Region    string `json:"region"`
	// Requests are the authorisations IAM checks for the operation (one or
	// more actions, each on its resource, with its condition keys); none
	// for an operation that needs no permission (sts:GetCallerIdentity).
	Requests []iampolicy.Request `json:"requests,omitempty"`
	// Unmapped says why Requests could not be derived: an operation the
	// mapping does not know, or an input it cannot read.
	Unmapped string `json:"unmapped,omitempty"`
}

type callerKey struct{}

// WithCaller labels ctx: the requests made with it are recorded as
// caller's when EnvCalls is set.
func WithCaller(ctx context.Context, caller string) context.Context {
	return context.WithValue(ctx, callerKey{}, caller)
}

// ReadCalls reads the calls recorded in path; a missing file holds none.
func ReadCalls(path string) ([]Call, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read calls: %w", err)
	}
	defer f.Close()
	var calls []Call
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64*1024), 16<<20)
	for n := 1; sc.Scan(); n++ {
		var c Call
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			return nil, fmt.Errorf("read calls: %s line %d: %w", path, n, err)
		}
		calls = append(calls, c)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read calls: %s: %w", path, err)
	}
	return calls, nil
}

// recordCalls adds the recorder to cfg's clients when EnvCalls is set.
func recordCalls(cfg *aws.Config) {
	path := os.Getenv(EnvCalls)
	if path == "" {
		return
	}
	r := &recorder{path: path, function: os.Getenv("AWS_LAMBDA_FUNCTION_NAME"), sts: sts.NewFromConfig(cfg.Copy())}
	cfg.APIOptions = append(cfg.APIOptions, func(s *middleware.Stack) error {
		return s.Initialize.Add(r, middleware.After)
	})
}

// recorder appends a Call per request to a file.
type recorder struct {
	path     string
	function string
	sts      *sts.Client // without the recorder: its own call is not recorded
}

func (*recorder) ID() string { return "RecordCalls" }

func (r *recorder) HandleInitialize(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (
	middleware.InitializeOutput, middleware.Metadata, error,
) {
	caller, _ := ctx.Value(callerKey{}).(string)
	if caller == "" {
		caller = r.function
	}
	out, md, err := next.HandleInitialize(ctx, in)
	if caller == "" {
		return out, md, err
	}
	c := Call{
		Caller:    caller,
		Service:   awsmiddleware.GetServiceID(ctx),
		Operation: awsmiddleware.GetOperationName(ctx),
		Region:    awsmiddleware.GetRegion(ctx),
	}
	account, aerr := r.account(ctx)
	if aerr != nil {
		c.Unmapped = aerr.Error()
	} else {
		c.Requests, aerr = authorizations(c.Service, c.Operation, in.Parameters, out.Result, c.Region, account)
		if aerr != nil {
			c.Unmapped = aerr.Error()
		}
	}
	if werr := r.write(c); werr != nil && err == nil {
		// The test reading the file must not miss a request.
		return out, md, werr
	}
	return out, md, err
}

// The account of the credentials in use, looked up once per process.
var (
	accountMu sync.Mutex
	accountID string
)

func (r *recorder) account(ctx context.Context) (string, error) {
	accountMu.Lock()
	defer accountMu.Unlock()
	if accountID != "" {
		return accountID, nil
	}
	out, err := r.sts.GetCallerIdentity(context.WithoutCancel(ctx), &sts.GetCallerIdentityInput{})
	if err != nil {
		return "", fmt.Errorf("record calls: look up the account: %w", err)
	}
	accountID = aws.ToString(out.Account)
	return accountID, nil
}

var writeMu sync.Mutex

// write appends c to the file as one line, in one write: processes
// appending to the same file do not interleave their lines.
func (r *recorder) write(c Call) error {
	b, err := json.Marshal(c)
	if err != nil {
		return fmt.Errorf("record calls: %w", err)
	}
	writeMu.Lock()
	defer writeMu.Unlock()
	f, err := os.OpenFile(r.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("record calls: %w", err)
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return fmt.Errorf("record calls: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("record calls: %w", err)
	}
	return nil
}
