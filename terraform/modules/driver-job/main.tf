# The job's driver under systemd: the unit /etc/systemd/system/spotring-job.service and a
# shell snippet that installs it, appended by the calling module to the driver's
# bootstrap (user data on AWS, custom data on Azure: run once, at first boot; the
# startup script on GCP: run at every boot). No provider, no resource: plain strings, so
# tests/terraform/test_terraform.py renders them with `terraform apply` alone.
#
# - It starts when the bootstrap ends (spotring and the job's code are then in place),
#   and at every boot after that (WantedBy=multi-user.target), after the network.
# - Restart=on-failure, RestartSec=10, and no start limit: a driver crash, an OOM kill or
#   a lost network restart `spotring run`, which resumes from the newest durable
#   checkpoint. A job that exits 0 leaves /var/lib/spotring/job-done behind and is not
#   started again at later boots (a changed unit clears it).
# - It runs as ssh_user (Horovod's ssh launcher logs in to the workers as the user that
#   runs spotring), never root, in working_directory (the workers start in the same one).
# - Nothing secret: the unit file is world-readable and the command line shows in `ps`.
#   Cloud credentials come from the host's own identity (instance role, service account,
#   managed identity), as the SDKs find them.
# - Stopping it (systemctl stop, a shutdown) sends SIGTERM to spotring alone
#   (KillMode=mixed), which stops the workers first, as Ctrl-C does, and exits 130.
# - There is no ssh agent under systemd: ExecStartPre waits for a readable private key
#   (ssh_identity_file, else ssh's default names), so that the job never starts, fails to
#   reach every worker and has them all replaced for want of a key.

locals {
  enabled = length(var.job_command) > 0

  # Where the bootstrap (worker_image/bootstrap.sh.tftpl) puts the venv and its state.
  venv      = "/opt/spotring/venv"
  state_dir = "/var/lib/spotring"

  argv = concat(
    ["${local.venv}/bin/spotring", "run"],
    var.provider_args,
    var.job_args,
    var.ssh_identity_file == "" ? [] : ["--ssh-identity-file", var.ssh_identity_file],
    var.checkpoint_uri == "" ? [] : ["--checkpoint", var.checkpoint_uri],
    ["--"],
    var.job_command,
  )

  # systemd's command-line syntax (systemd.service(5), "Command lines"): every argument
  # in double quotes, inside which backslash and the double quote are escaped C-style;
  # "%" starts a specifier and "$" a variable substitution, so both are doubled. A quoted
  # ";" is an argument, not a command separator. The executable is a fixed path.
  exec_start = join(" ", concat([local.argv[0]], [
    for word in slice(local.argv, 1, length(local.argv)) :
    "\"${replace(replace(replace(replace(word, "\\", "\\\\"), "\"", "\\\""), "%", "%%"), "$", "$$")}\""
  ]))

  # The keys ssh tries without -i, in ssh_user's home ($$: a dollar for the shell).
  ssh_keys = var.ssh_identity_file != "" ? [var.ssh_identity_file] : [
    "$$HOME/.ssh/id_ed25519", "$$HOME/.ssh/id_ecdsa", "$$HOME/.ssh/id_rsa",
  ]
  key_check = join("", [
    "for key in ${join(" ", formatlist("\"%s\"", local.ssh_keys))}; do test -r \"$$key\" && exit 0; done; ",
    "echo \"spotring-job: no readable ssh key for the workers (${join(", ", local.ssh_keys)}): ",
    "copy the private half of a key in ssh_public_keys there\" >&2; exit 1",
  ])

  unit = <<-EOT
    # spotring-job.service, written by the spotring Terraform module (terraform/modules/driver-job).
    [Unit]
    Description=spotring job on group ${var.group_name}
    Wants=network-online.target
    After=network-online.target
    StartLimitIntervalSec=0
    ConditionPathExists=!${local.state_dir}/job-done

    [Service]
    Type=simple
    User=${var.ssh_user}
    WorkingDirectory=${var.working_directory == "" ? "~" : var.working_directory}
    Environment=PATH=${local.venv}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
    Environment=PYTHONUNBUFFERED=1
    NoNewPrivileges=yes
    ExecStartPre=/bin/sh -c '${local.key_check}'
    ExecStart=${local.exec_start}
    ExecStopPost=+/bin/sh -c 'if [ "$$EXIT_CODE" = exited ] && [ "$$EXIT_STATUS" = 0 ]; then touch ${local.state_dir}/job-done; fi'
    Restart=on-failure
    RestartSec=10
    SuccessExitStatus=130
    KillMode=mixed
    TimeoutStopSec=90

    [Install]
    WantedBy=multi-user.target
  EOT

  # Appended to the bootstrap, which runs it as root after main() succeeded (set -e: a
  # failed bootstrap never gets here). An unchanged unit is left alone (GCP runs the
  # startup script at every boot, and systemd has started the enabled unit by then); a
  # new or changed one is installed, enabled and (re)started without waiting for it.
  installer = <<-EOT
    # spotring-job.service (terraform/modules/driver-job): the job under systemd.
    install_spotring_job() {
      # Overridable for tests, as in the bootstrap.
      local unit_dir=$${SPOTRING_SYSTEMD_DIR:-/etc/systemd/system}
      local state_dir=$${SPOTRING_STATE_DIR:-${local.state_dir}}
      local unit="$unit_dir/spotring-job.service" staged
      staged=$(mktemp)
      cat >"$staged" <<'SPOTRING_JOB_UNIT'
    ${local.unit}SPOTRING_JOB_UNIT
      if cmp -s "$staged" "$unit"; then
        rm -f "$staged"
        return 0
      fi
      install -m 0644 "$staged" "$unit"
      rm -f "$staged" "$state_dir/job-done"
      systemctl daemon-reload
      systemctl enable spotring-job.service
      systemctl restart --no-block spotring-job.service
      log "spotring-job.service installed and started: journalctl -u spotring-job -f"
    }
    install_spotring_job
  EOT
}
