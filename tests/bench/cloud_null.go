package main

// A stand-in for SQS that accepts every SendMessageBatch at once and keeps
// nothing. Behind the latency proxy it answers as fast as a distant SQS
// that is never the bottleneck, which shows the poller's own ceiling at a
// given latency apart from the emulator's.

import (
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strconv"
	"sync/atomic"
)

// cloudNullSQS answers the SQS JSON protocol's SendMessageBatch. Safe for
// concurrent use.
type cloudNullSQS struct {
	messages atomic.Int64
}

func (n *cloudNullSQS) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("X-Amz-Target") != "AmazonSQS.SendMessageBatch" {
		http.Error(w, `{"__type":"UnsupportedOperation"}`, http.StatusBadRequest)
		return
	}
	var in struct {
		Entries []struct {
			ID          string `json:"Id"`
			MessageBody string
		}
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		http.Error(w, `{"__type":"InvalidRequest"}`, http.StatusBadRequest)
		return
	}
	type entry struct {
		ID        string `json:"Id"`
		MessageID string `json:"MessageId"`
		MD5       string `json:"MD5OfMessageBody"`
	}
	out := struct {
		Successful []entry
	}{Successful: make([]entry, len(in.Entries))}
	for i, e := range in.Entries {
		sum := md5.Sum([]byte(e.MessageBody)) // the SDK checks it
		out.Successful[i] = entry{ID: e.ID, MessageID: strconv.FormatInt(n.messages.Add(1), 10), MD5: hex.EncodeToString(sum[:])}
	}
	w.Header().Set("Content-Type", "application/x-amz-json-1.0")
	_ = json.NewEncoder(w).Encode(out)
}
