# Durable checkpoints (checkpoint_uri = s3://BUCKET/PREFIX): what the hosts' instance
# roles may do in that bucket. Nothing at all without checkpoint_uri.
#
# spotring's storage layer (`spotring run --checkpoint`) calls S3 through boto3 with the
# instance profile's credentials, on the workers (writing checkpoints, reading them on
# resume, deleting all but the last --checkpoint-keep) and on the driver (the job's lock,
# reading the newest manifest). Every key it touches lies under PREFIX/, and it lists
# with a prefix that starts with PREFIX/. The bucket is yours: the module creates none.
#
# | who     | actions                                            | on                           |
# |---------|----------------------------------------------------|------------------------------|
# | both    | s3:ListBucket, if s3:prefix is PREFIX/ or PREFIX/* | arn:aws:s3:::BUCKET          |
# | workers | s3:GetObject, s3:PutObject, s3:DeleteObject,       | arn:aws:s3:::BUCKET/PREFIX/* |
# |         | s3:AbortMultipartUpload                            |                              |
# | driver  | s3:GetObject                                       | arn:aws:s3:::BUCKET/PREFIX/* |
# | driver  | s3:PutObject, s3:DeleteObject                      | .../PREFIX/lock.json only    |
#
# Which calls need which action (Amazon S3 User Guide, "Multipart upload API and
# permissions"; the S3 API reference of each call):
# - ListObjectsV2: s3:ListBucket on the bucket; the s3:prefix condition key is the
#   request's Prefix, so no other part of the bucket can be listed.
# - GetObject, HeadObject: s3:GetObject.
# - PutObject, also with If-None-Match: * (the lock's conditional create; a 412 when it
#   exists), and a multipart upload's CreateMultipartUpload, UploadPart and
#   CompleteMultipartUpload: s3:PutObject.
# - AbortMultipartUpload: s3:AbortMultipartUpload. boto3's upload_fileobj goes multipart
#   above its multipart_threshold (16 MiB in spotring's store, 8 MiB by default) and
#   aborts the upload when a part fails (s3transfer/tasks.py, CreateMultipartUploadTask's
#   cleanup); it never lists parts or uploads, so s3:ListMultipartUploadParts and
#   s3:ListBucketMultipartUploads are not granted.
# - DeleteObject, DeleteObjects: s3:DeleteObject, for each key.
# A bucket encrypted with a customer managed KMS key also needs kms:GenerateDataKey and
# kms:Decrypt on that key for both roles: the module grants no KMS access (SSE-S3, S3's
# default, needs none).

locals {
  checkpoints = var.checkpoint_uri != ""

  # [BUCKET, PREFIX] of s3://BUCKET/PREFIX (the variable's validation ensures the form;
  # a trailing slash is dropped).
  checkpoint_location   = local.checkpoints ? regex("^s3://([^/]+)/(.+?)/?$", var.checkpoint_uri) : ["", ""]
  checkpoint_bucket_arn = "arn:${data.aws_partition.current.partition}:s3:::${local.checkpoint_location[0]}"
  checkpoint_prefix     = local.checkpoint_location[1]

  # Appended to spotring_command (outputs.tf).
  checkpoint_option = local.checkpoints ? " --checkpoint ${var.checkpoint_uri}" : ""
}

# aws, aws-cn or aws-us-gov, for the ARNs.
data "aws_partition" "current" {}

data "aws_iam_policy_document" "worker_checkpoints" {
  count = local.checkpoints ? 1 : 0

  statement {
    sid       = "ListCheckpoints"
    actions   = ["s3:ListBucket"]
    resources = [local.checkpoint_bucket_arn]

    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = ["${local.checkpoint_prefix}/", "${local.checkpoint_prefix}/*"]
    }
  }

  statement {
    sid = "ReadWriteCheckpoints"
    actions = [
      "s3:GetObject",
      "s3:PutObject",
      "s3:DeleteObject",
      "s3:AbortMultipartUpload",
    ]
    resources = ["${local.checkpoint_bucket_arn}/${local.checkpoint_prefix}/*"]
  }
}

data "aws_iam_policy_document" "driver_checkpoints" {
  count = local.checkpoints ? 1 : 0

  statement {
    sid       = "ListCheckpoints"
    actions   = ["s3:ListBucket"]
    resources = [local.checkpoint_bucket_arn]

    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = ["${local.checkpoint_prefix}/", "${local.checkpoint_prefix}/*"]
    }
  }

  # The newest manifest, and the lock's holder and heartbeat.
  statement {
    sid       = "ReadCheckpoints"
    actions   = ["s3:GetObject"]
    resources = ["${local.checkpoint_bucket_arn}/${local.checkpoint_prefix}/*"]
  }

  # The job's lock: created with If-None-Match, overwritten as a heartbeat, deleted at
  # the end. The driver writes nothing else.
  statement {
    sid       = "HoldTheJobLock"
    actions   = ["s3:PutObject", "s3:DeleteObject"]
    resources = ["${local.checkpoint_bucket_arn}/${local.checkpoint_prefix}/lock.json"]
  }
}

resource "aws_iam_role_policy" "worker_checkpoints" {
  count = local.checkpoints ? 1 : 0

  name   = "spotring-checkpoints"
  role   = aws_iam_role.worker.id
  policy = data.aws_iam_policy_document.worker_checkpoints[0].json
}

resource "aws_iam_role_policy" "driver_checkpoints" {
  count = local.checkpoints ? 1 : 0

  name   = "spotring-checkpoints"
  role   = aws_iam_role.driver.id
  policy = data.aws_iam_policy_document.driver_checkpoints[0].json
}
