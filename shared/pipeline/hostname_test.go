package pipeline

import (
	"os"
	"testing"

	"github.com/aws/aws-lambda-go/lambdacontext"
)

// TestHostnameNamesLogStream: in a Lambda execution environment the lease
// records the environment's log stream as the holder's host, so an operator
// (or a test) finds the holder's records and process; elsewhere the
// machine's name. Not parallel: it sets the package's view of the
// environment.
func TestHostnameNamesLogStream(t *testing.T) {
	saved := lambdacontext.LogStreamName
	t.Cleanup(func() { lambdacontext.LogStreamName = saved })

	lambdacontext.LogStreamName = ""
	want, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	if got := Hostname(); got != want {
		t.Errorf("Hostname() outside Lambda = %q, want the machine's %q", got, want)
	}
	const stream = "2026/11/28/[$LATEST]0123456789abcdef"
	lambdacontext.LogStreamName = stream
	if got := Hostname(); got != stream {
		t.Errorf("Hostname() in an execution environment = %q, want its log stream %q", got, stream)
	}
}
