// --tee swtpm: a TPM 2.0 (Debian's swtpm, driven with tpm2-tools) as the aggregator's root of
// trust. The host starts swtpm, creates a restricted ECDSA P-256 signing key (the attestation
// key, AK) under the owner hierarchy, resets PCR 16 and extends it with the SHA-256 of the
// enclave program before starting it (a measured launch). A quote (TPM2_Quote) over PCR 16 with
// qualifying data chosen by the verifier proves that this TPM's AK signed: PCR 16 holds
// exactly that program's measurement, and the data is fresh. verify_tpm_quote checks a quote's
// TPMS_ATTEST and signature with OpenSSL.

#include "tee_tpm.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <openssl/pem.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace troupe::federated::tee {
namespace {

[[noreturn]] void fail(const std::string& why) { throw std::runtime_error("tee swtpm: " + why); }

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read " + path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// Runs `argv` with `env_extra` added, standard output and error to `log`; its exit status.
int run(const std::vector<std::string>& args, const std::vector<std::string>& env_extra, const std::string& log, pid_t* started = nullptr) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  std::vector<std::string> a = args, e = env_extra;
  for (char** p = environ; *p; ++p) e.emplace_back(*p);
  std::vector<char*> argv, envp;
  for (auto& s : a) argv.push_back(s.data());
  argv.push_back(nullptr);
  for (auto& s : e) envp.push_back(s.data());
  envp.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, a[0].c_str(), &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) fail("cannot start " + a[0] + ": " + std::strerror(rc));
  if (started) {
    *started = pid;
    return 0;
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::uint16_t free_port_pair() {
  // Two consecutive free loopback ports: the TPM's and its control channel's.
  for (int attempt = 0; attempt < 50; ++attempt) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t n = sizeof a;
    if (s < 0 || bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || getsockname(s, reinterpret_cast<sockaddr*>(&a), &n) != 0) {
      if (s >= 0) close(s);
      continue;
    }
    const std::uint16_t port = ntohs(a.sin_port);
    int t = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in b = a;
    b.sin_port = htons(static_cast<std::uint16_t>(port + 1));
    const bool ok = port < 65535 && t >= 0 && bind(t, reinterpret_cast<sockaddr*>(&b), sizeof b) == 0;
    close(s);
    if (t >= 0) close(t);
    if (ok) return port;
  }
  fail("no two consecutive free loopback ports");
}

std::uint16_t be16(const std::uint8_t* p) { return static_cast<std::uint16_t>(p[0] << 8 | p[1]); }
std::uint32_t be32(const std::uint8_t* p) {
  return static_cast<std::uint32_t>(p[0]) << 24 | static_cast<std::uint32_t>(p[1]) << 16 | static_cast<std::uint32_t>(p[2]) << 8 | p[3];
}

std::array<std::uint8_t, 32> sha256(std::span<const std::uint8_t> a, std::span<const std::uint8_t> b = {}) {
  std::array<std::uint8_t, 32> out{};
  EVP_MD_CTX* md = EVP_MD_CTX_new();
  unsigned int n = 0;
  const bool ok = md && EVP_DigestInit_ex(md, EVP_sha256(), nullptr) == 1 && EVP_DigestUpdate(md, a.data(), a.size()) == 1 &&
                  EVP_DigestUpdate(md, b.data(), b.size()) == 1 && EVP_DigestFinal_ex(md, out.data(), &n) == 1;
  EVP_MD_CTX_free(md);
  if (!ok) fail("SHA-256 failed");
  return out;
}

}  // namespace

bool swtpm_available() {
  for (const char* tool : {"swtpm", "tpm2_quote", "tpm2_createprimary", "tpm2_pcrextend"}) {
    bool found = false;
    if (const char* path = std::getenv("PATH"))
      for (std::string_view rest = path; !rest.empty();) {
        const auto colon = rest.find(':');
        const auto dir = rest.substr(0, colon);
        if (!dir.empty() && access((std::string(dir) + "/" + tool).c_str(), X_OK) == 0) found = true;
        rest = colon == std::string_view::npos ? std::string_view() : rest.substr(colon + 1);
      }
    if (!found) return false;
  }
  return true;
}

std::array<std::uint8_t, 32> pcr_after_extend(std::span<const std::uint8_t, 32> measurement) {
  const std::array<std::uint8_t, 32> zero{};
  return sha256(zero, measurement);
}

swtpm_platform::swtpm_platform(std::span<const std::uint8_t, 32> measurement) {
  try {
    start(measurement);
  } catch (...) {
    stop();  // a constructor that throws runs no destructor: the swtpm process and its directory go here
    throw;
  }
}

void swtpm_platform::start(std::span<const std::uint8_t, 32> measurement) {
  if (!swtpm_available())
    throw std::invalid_argument("--tee swtpm needs swtpm and tpm2-tools on the PATH (Debian packages swtpm, swtpm-tools and "
                                "tpm2-tools, which cmake/install-deps.sh installs)");
  char tmpl[] = "/tmp/troupe-swtpm-XXXXXX";
  if (!mkdtemp(tmpl)) fail("cannot make a temporary directory");
  dir_ = tmpl;
  const std::uint16_t port = free_port_pair();
  tcti_ = "swtpm:host=127.0.0.1,port=" + std::to_string(port);
  const std::string log = dir_ + "/tpm.log";
  std::filesystem::create_directory(dir_ + "/state");
  run({"swtpm", "socket", "--tpm2", "--server", "type=tcp,port=" + std::to_string(port) + ",bindaddr=127.0.0.1", "--ctrl",
       "type=tcp,port=" + std::to_string(port + 1) + ",bindaddr=127.0.0.1", "--tpmstate", "dir=" + dir_ + "/state", "--flags",
       "not-need-init,startup-clear"},
      {}, log, &pid_);
  const std::vector<std::string> env{"TPM2TOOLS_TCTI=" + tcti_};
  auto tool = [&](std::vector<std::string> args) {
    if (run(args, env, log) != 0) fail(args[0] + " failed; see " + log + ": " + read_file(log));
    run({"tpm2_flushcontext", "-t"}, env, log);
  };
  // swtpm needs a moment to listen: the first command retries.
  for (int i = 0;; ++i) {
    if (run({"tpm2_pcrreset", "16"}, env, log) == 0) break;
    if (i == 100) fail("swtpm did not answer; see " + log + ": " + read_file(log));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  tool({"tpm2_createprimary", "-C", "o", "-g", "sha256", "-G", "ecc", "-c", dir_ + "/primary.ctx", "-Q"});
  tool({"tpm2_create", "-C", dir_ + "/primary.ctx", "-G", "ecc256:ecdsa-sha256:null", "-u", dir_ + "/ak.pub", "-r", dir_ + "/ak.priv",
        "-a", "fixedtpm|fixedparent|sensitivedataorigin|userwithauth|restricted|sign|noda", "-Q"});
  tool({"tpm2_load", "-C", dir_ + "/primary.ctx", "-u", dir_ + "/ak.pub", "-r", dir_ + "/ak.priv", "-c", dir_ + "/ak.ctx", "-Q"});
  tool({"tpm2_readpublic", "-c", dir_ + "/ak.ctx", "-f", "pem", "-o", dir_ + "/ak.pem", "-Q"});
  ak_pem_ = read_file(dir_ + "/ak.pem");
  tool({"tpm2_pcrextend", "16:sha256=" + dcap::to_hex(measurement)});
}

swtpm_platform::~swtpm_platform() { stop(); }

void swtpm_platform::stop() noexcept {
  if (pid_ > 0) {
    kill(pid_, SIGTERM);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  std::error_code ec;
  if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  dir_.clear();
}

tpm_quote quote_with_tpm(const std::string& tcti, const std::string& ak_context, std::span<const std::uint8_t, 32> qualifying) {
  char tmpl[] = "/tmp/troupe-quote-XXXXXX";
  if (!mkdtemp(tmpl)) fail("cannot make a temporary directory");
  const std::string d = tmpl, log = d + "/log";
  const std::vector<std::string> env{"TPM2TOOLS_TCTI=" + tcti};
  const int rc = run({"tpm2_quote", "-c", ak_context, "-l", "sha256:16", "-q", dcap::to_hex(qualifying), "-m", d + "/msg", "-s", d + "/sig",
                      "-g", "sha256", "-f", "plain"},
                     env, log);
  run({"tpm2_flushcontext", "-t"}, env, log);
  struct remove_dir {
    const std::string& path;
    ~remove_dir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  } cleanup{d};
  if (rc != 0) fail("tpm2_quote failed: " + read_file(log));
  tpm_quote q;
  const auto m = read_file(d + "/msg"), s = read_file(d + "/sig");
  q.attest.assign(m.begin(), m.end());
  q.signature.assign(s.begin(), s.end());
  return q;
}

std::string verify_tpm_quote(const tpm_quote& q, const std::string& ak_pem, std::span<const std::uint8_t, 32> qualifying,
                             std::span<const std::uint8_t, 32> expected_pcr16) {
  // The signature first: nothing in an unsigned TPMS_ATTEST means anything.
  BIO* bio = BIO_new_mem_buf(ak_pem.data(), static_cast<int>(ak_pem.size()));
  EVP_PKEY* key = bio ? PEM_read_bio_PUBKEY(bio, nullptr, nullptr, nullptr) : nullptr;
  BIO_free(bio);
  if (!key) return "the attestation key does not parse";
  EVP_MD_CTX* md = EVP_MD_CTX_new();
  const bool signed_ok = md && EVP_DigestVerifyInit(md, nullptr, EVP_sha256(), nullptr, key) == 1 &&
                         EVP_DigestVerify(md, q.signature.data(), q.signature.size(), q.attest.data(), q.attest.size()) == 1;
  EVP_MD_CTX_free(md);
  EVP_PKEY_free(key);
  if (!signed_ok) return "the quote's signature does not verify under the attestation key";
  return check_tpm_attest(q.attest, qualifying, expected_pcr16);
}

std::string check_tpm_attest(std::span<const std::uint8_t> a, std::span<const std::uint8_t, 32> qualifying,
                             std::span<const std::uint8_t, 32> expected_pcr16) {
  // TPMS_ATTEST (TPM 2.0 Part 2, 10.12.12), big-endian: magic, type, qualifiedSigner (TPM2B),
  // extraData (TPM2B), clockInfo (17 bytes), firmwareVersion (8), then TPMS_QUOTE_INFO: the PCR
  // selection (TPML_PCR_SELECTION) and pcrDigest (TPM2B).
  std::size_t at = 0;
  auto need = [&](std::size_t n) { return a.size() - at >= n; };
  if (!need(6) || be32(a.data()) != 0xff544347u) return "not a TPM-generated structure (magic)";
  if (be16(a.data() + 4) != 0x8018) return "not a quote (TPM_ST_ATTEST_QUOTE)";
  at = 6;
  if (!need(2)) return "truncated at qualifiedSigner";
  const std::size_t signer = be16(a.data() + at);
  if (!need(2 + signer)) return "truncated in qualifiedSigner";
  at += 2 + signer;
  if (!need(2)) return "truncated at extraData";
  const std::size_t extra = be16(a.data() + at);
  at += 2;
  if (!need(extra)) return "truncated in extraData";
  if (extra != 32 || std::memcmp(a.data() + at, qualifying.data(), 32) != 0)
    return "the quote's qualifying data is not SHA-256(enclave key || nonce data)";
  at += extra;
  if (!need(17 + 8)) return "truncated at clockInfo";
  if (a[at + 16] != 1) return "the TPM's clock is not safe";
  at += 17 + 8;
  if (!need(4 + 2 + 1 + 3) || be32(a.data() + at) != 1) return "the quote does not select exactly one PCR bank";
  at += 4;
  if (be16(a.data() + at) != 0x000b) return "the PCR bank is not SHA-256";
  at += 2;
  if (a[at] != 3 || a[at + 1] != 0x00 || a[at + 2] != 0x00 || a[at + 3] != 0x01) return "the quote does not select PCR 16 alone";
  at += 4;
  if (!need(2 + 32) || be16(a.data() + at) != 32) return "the PCR digest is not 32 bytes";
  at += 2;
  const auto want = sha256(expected_pcr16);
  if (std::memcmp(a.data() + at, want.data(), 32) != 0) return "PCR 16 does not hold the expected program's measurement";
  at += 32;
  if (at != a.size()) return "bytes after the quote";
  return "";
}

}  // namespace troupe::federated::tee
