package config

// The names of the AWS resources. The local bootstrap and the CDK stack both use
// these functions, so a stack deployed by either finds the same resources.

// TableName is the DynamoDB table holding one item per job (lease and checkpoint).
func (f *File) TableName() string { return f.Stack.Prefix + "-state" }

// QueueName is the work queue of one (job, output).
func (f *File) QueueName(j *Job, o *Output) string {
	return f.Stack.Prefix + "-" + j.ID + "-" + o.ID + o.queueSuffix()
}

// DLQName is the dead-letter queue of one (job, output).
func (f *File) DLQName(j *Job, o *Output) string {
	return f.Stack.Prefix + "-" + j.ID + "-" + o.ID + "-dlq" + o.queueSuffix()
}

// FIFO reports whether the output's queues are FIFO queues.
func (o *Output) FIFO() bool { return o.Ordering == OrderingPerDocument }

func (o *Output) queueSuffix() string {
	if o.FIFO() {
		return ".fifo"
	}
	return ""
}

// ClaimCheckPrefix is the key prefix of claim-check payloads in the stack bucket.
const ClaimCheckPrefix = "claim-check/"

// Route is a resolved (job, output) pair.
type Route struct {
	Job    *Job
	Output *Output
}

// RouteByQueueName finds the (job, output) whose work queue has the given name.
func (f *File) RouteByQueueName(name string) (Route, bool) {
	for _, j := range f.Jobs {
		for _, o := range j.Outputs {
			if f.QueueName(j, o) == name {
				return Route{Job: j, Output: o}, true
			}
		}
	}
	return Route{}, false
}
