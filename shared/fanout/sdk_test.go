package fanout_test

import (
	"context"
	"crypto/md5"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/changes-worker/changes-worker/shared/fanout"
)

var testCreds = aws.Credentials{AccessKeyID: "AKIDTEST", SecretAccessKey: "secret-for-tests"}

// sdkSQS is an SQS endpoint for the SDK's client: it checks each
// SendMessageBatch request's headers and SigV4 signature, decodes its body
// as SQS does, and records the entries; every entry is accepted, its MD5
// digest the one md5Of returns (the true one when nil).
type sdkSQS struct {
	t     *testing.T
	md5Of func(body string) string
	// fail, when set, fails the entries for which it returns a code.
	fail func(id string) (code string, senderFault bool)

	mu      sync.Mutex
	entries map[string][]sdkEntry // by queue URL
}

type sdkEntry struct {
	ID, MessageBody, MessageGroupID, MessageDeduplicationID string
}

func (s *sdkSQS) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if err := checkSignature(r, body); err != nil {
		s.t.Errorf("request signature: %v", err)
		http.Error(w, err.Error(), http.StatusForbidden)
		return
	}
	if got := r.Header.Get("X-Amz-Target"); got != "AmazonSQS.SendMessageBatch" {
		s.t.Errorf("X-Amz-Target = %q", got)
	}
	if got := r.Header.Get("Content-Type"); got != "application/x-amz-json-1.0" {
		s.t.Errorf("Content-Type = %q", got)
	}
	var in struct {
		QueueURL string `json:"QueueUrl"`
		Entries  []struct {
			ID                     string `json:"Id"`
			MessageBody            string
			MessageGroupID         string `json:"MessageGroupId"`
			MessageDeduplicationID string `json:"MessageDeduplicationId"`
		}
	}
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		s.t.Errorf("request body %.200q: %v", body, err)
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	type ok struct {
		ID        string `json:"Id"`
		MessageID string `json:"MessageId"`
		MD5       string `json:"MD5OfMessageBody"`
	}
	type failed struct {
		ID          string `json:"Id"`
		Code        string
		Message     string
		SenderFault bool
	}
	out := struct {
		Successful []ok
		Failed     []failed
	}{Failed: []failed{}}
	s.mu.Lock()
	for _, e := range in.Entries {
		if s.fail != nil {
			if code, sender := s.fail(e.ID); code != "" {
				out.Failed = append(out.Failed, failed{ID: e.ID, Code: code, Message: "refused " + e.ID, SenderFault: sender})
				continue
			}
		}
		s.entries[in.QueueURL] = append(s.entries[in.QueueURL], sdkEntry{e.ID, e.MessageBody, e.MessageGroupID, e.MessageDeduplicationID})
		sum := md5.Sum([]byte(e.MessageBody))
		digest := hex.EncodeToString(sum[:])
		if s.md5Of != nil {
			digest = s.md5Of(e.MessageBody)
		}
		out.Successful = append(out.Successful, ok{ID: e.ID, MessageID: "m-" + e.ID, MD5: digest})
	}
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-amz-json-1.0")
	_ = json.NewEncoder(w).Encode(out)
}

// checkSignature signs again, with the test credentials, the headers r
// says it signed and body, and compares the signatures.
func checkSignature(r *http.Request, body []byte) error {
	auth := r.Header.Get("Authorization")
	_, signed, ok := strings.Cut(auth, "SignedHeaders=")
	if !ok {
		return fmt.Errorf("no signed headers in %q", auth)
	}
	signed, _, _ = strings.Cut(signed, ",")
	at, err := time.Parse("20060102T150405Z", r.Header.Get("X-Amz-Date"))
	if err != nil {
		return fmt.Errorf("X-Amz-Date: %w", err)
	}
	req, err := http.NewRequest(r.Method, "http://"+r.Host+r.URL.RequestURI(), strings.NewReader(string(body)))
	if err != nil {
		return err
	}
	for _, h := range strings.Split(signed, ";") {
		if h != "host" {
			req.Header[http.CanonicalHeaderKey(h)] = r.Header.Values(h)
		}
	}
	req.ContentLength = int64(len(body))
	sum := sha256.Sum256(body)
	if err := v4.NewSigner().SignHTTP(context.Background(), testCreds, req, hex.EncodeToString(sum[:]), "sqs", "us-east-1", at); err != nil {
		return err
	}
	if want := req.Header.Get("Authorization"); want != auth {
		return fmt.Errorf("Authorization %q, want %q for the body received", auth, want)
	}
	return nil
}

func newSDKSQS(t *testing.T, s *sdkSQS) (*sqs.Client, string) {
	t.Helper()
	s.t, s.entries = t, map[string][]sdkEntry{}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	c := sqs.New(sqs.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(srv.URL),
		Credentials:  credentials.StaticCredentialsProvider{Value: testCreds},
	})
	return c, srv.URL
}

// Through the SDK's client, SQS receives every envelope as its message
// body, as json.Marshal writes it (invalid UTF-8 as U+FFFD, which is what
// the SDK sends), with the ids, groups and deduplication ids of the
// entries, in a request whose signature covers the body.
func TestSendThroughTheSDK(t *testing.T) {
	t.Parallel()
	ids := []string{"plain", "with \"quotes\" & <tags>\\", "line\u2028sep", "bad \xff utf-8", "ünï\tcode", strings.Repeat("long", 40)}
	changes := changesOf(ids...)
	for i, c := range changes {
		c.EnqueuedAt = time.Date(2026, 11, 28, 3, 4, 5, 123456789, time.UTC)
		switch i % 3 {
		case 0:
			c.Doc = json.RawMessage("{\"a\":[1,\"<&>\\n\\u0001\"],\"b\":\"\u2029\",\"c\":\"\xfe\",\"d\":\"\x7f\"}")
		case 1:
			c.Deleted, c.Doc = true, nil
		case 2:
			c.Seq = json.RawMessage(` [ 3, "g1AAAA" ] `)
		}
	}
	s := &sdkSQS{}
	client, url := newSDKSQS(t, s)
	targets := []fanout.Target{
		{Output: "pg", QueueURL: url + "/000000000000/pg"},
		{Output: "rest-api", QueueURL: url + "/000000000000/rest.fifo", FIFO: true, Epoch: 2},
	}
	snd := &fanout.Sender{SQS: client, MaxBytes: 256 * 1024}
	if _, err := snd.Send(context.Background(), targets, changes, func() error { return nil }); err != nil {
		t.Fatalf("send: %v", err)
	}
	for _, tg := range targets {
		got := s.entries[tg.QueueURL]
		if len(got) != len(changes) {
			t.Fatalf("%s got %d entries, want %d", tg.QueueURL, len(got), len(changes))
		}
		for i, e := range got {
			env := *changes[i]
			env.Output = tg.Output
			b, err := json.Marshal(&env)
			if err != nil {
				t.Fatal(err)
			}
			want := sdkEntry{ID: fmt.Sprint(i), MessageBody: strings.ToValidUTF8(string(b), "\ufffd")}
			if tg.FIFO {
				want.MessageGroupID = tg.Group(env.DocID)
				want.MessageDeduplicationID = fanout.DeduplicationID(env.Job, tg.Output, env.DocID, env.Seq, tg.Epoch)
			}
			if e != want {
				t.Errorf("%s, change %d: entry\n%+v\nwant\n%+v", tg.QueueURL, i, e, want)
			}
		}
	}
}

// The MD5 digests of the answer are not checked: the request's signature
// covers its body, so SQS refuses one that changed on the way.
func TestSendLeavesTheAnswersDigestsUnchecked(t *testing.T) {
	t.Parallel()
	s := &sdkSQS{md5Of: func(string) string { return strings.Repeat("0", 32) }}
	client, url := newSDKSQS(t, s)
	snd := &fanout.Sender{SQS: client, MaxBytes: 256 * 1024}
	changes := changesOf("a", "b")
	st, err := snd.Send(context.Background(), []fanout.Target{{Output: "o", QueueURL: url + "/000000000000/o"}}, changes, func() error { return nil })
	if err != nil {
		t.Fatalf("send: %v", err)
	}
	if st.Messages != len(changes) {
		t.Errorf("messages = %d, want %d", st.Messages, len(changes))
	}
}

// The entries an answer lists as failed are sent again, and a sender fault
// is ErrRejected naming its code and message.
func TestSendRetriesWhatTheSDKAnswerFails(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	tries := map[string]int{}
	s := &sdkSQS{fail: func(id string) (string, bool) {
		mu.Lock()
		defer mu.Unlock()
		tries[id]++
		switch {
		case id == "1" && tries[id] == 1:
			return "InternalError", false
		case id == "2":
			return "InvalidMessageContents", true
		}
		return "", false
	}}
	client, url := newSDKSQS(t, s)
	snd := &fanout.Sender{SQS: client, MaxBytes: 256 * 1024, Backoff: time.Millisecond}
	target := []fanout.Target{{Output: "o", QueueURL: url + "/000000000000/o"}}
	if _, err := snd.Send(context.Background(), target, changesOf("a", "b"), func() error { return nil }); err != nil {
		t.Fatalf("send: %v", err)
	}
	if got := tries["1"]; got != 2 {
		t.Errorf("entry 1 sent %d times, want 2 (failed once, then accepted)", got)
	}
	if got, want := len(s.entries[target[0].QueueURL]), 2; got != want {
		t.Errorf("accepted %d entries, want %d", got, want)
	}
	_, err := snd.Send(context.Background(), target, changesOf("a", "b", "c"), func() error { return nil })
	if !errors.Is(err, fanout.ErrRejected) || !strings.Contains(err.Error(), "InvalidMessageContents refused 2") {
		t.Errorf("send error = %v, want ErrRejected naming InvalidMessageContents and its message", err)
	}
}
