#include "common/rpc/tls.h"

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tessera {
namespace {

template <typename T, void (*F)(T*)>
struct Deleter {
  void operator()(T* p) const { F(p); }
};
using PKey = std::unique_ptr<EVP_PKEY, Deleter<EVP_PKEY, EVP_PKEY_free>>;
using Cert = std::unique_ptr<X509, Deleter<X509, X509_free>>;
using Bio = std::unique_ptr<BIO, Deleter<BIO, BIO_free_all>>;

absl::Status OpenSslError(absl::string_view what) {
  return absl::InternalError(absl::StrCat("openssl: ", what));
}

std::string BioString(BIO* b) {
  char* data = nullptr;
  long n = BIO_get_mem_data(b, &data);
  return std::string(data, n);
}

absl::StatusOr<std::string> KeyPem(EVP_PKEY* k) {
  Bio b(BIO_new(BIO_s_mem()));
  if (!PEM_write_bio_PrivateKey(b.get(), k, nullptr, nullptr, 0, nullptr, nullptr)) return OpenSslError("write key");
  return BioString(b.get());
}

absl::StatusOr<std::string> CertPem(X509* c) {
  Bio b(BIO_new(BIO_s_mem()));
  if (!PEM_write_bio_X509(b.get(), c)) return OpenSslError("write certificate");
  return BioString(b.get());
}

bool AddExt(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (!ext) return false;
  bool ok = X509_add_ext(cert, ext, -1) == 1;
  X509_EXTENSION_free(ext);
  return ok;
}

absl::StatusOr<Cert> NewCert(EVP_PKEY* key, const std::string& cn, int days) {
  Cert c(X509_new());
  X509_set_version(c.get(), 2);
  unsigned char serial[16];
  BIGNUM* bn = BN_new();
  if (!BN_rand(bn, 127, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY)) { BN_free(bn); return OpenSslError("serial"); }
  (void)serial;
  BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(c.get()));
  BN_free(bn);
  X509_gmtime_adj(X509_getm_notBefore(c.get()), -3600);  // tolerate small clock skew
  X509_gmtime_adj(X509_getm_notAfter(c.get()), static_cast<long>(days) * 86400);
  X509_set_pubkey(c.get(), key);
  X509_NAME* name = X509_get_subject_name(c.get());
  X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC, reinterpret_cast<const unsigned char*>("tessera"), -1, -1, 0);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  return c;
}

absl::StatusOr<PKey> LoadKey(const std::string& pem) {
  Bio b(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  EVP_PKEY* k = PEM_read_bio_PrivateKey(b.get(), nullptr, nullptr, nullptr);
  if (!k) return OpenSslError("cannot parse CA key");
  return PKey(k);
}

absl::StatusOr<Cert> LoadCert(const std::string& pem) {
  Bio b(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  X509* c = PEM_read_bio_X509(b.get(), nullptr, nullptr, nullptr);
  if (!c) return OpenSslError("cannot parse CA certificate");
  return Cert(c);
}

}  // namespace

absl::StatusOr<KeyPair> MakeCa(const std::string& cn) {
  PKey key(EVP_EC_gen("P-256"));
  if (!key) return OpenSslError("generate CA key");
  auto cert = NewCert(key.get(), cn, 3650);
  if (!cert.ok()) return cert.status();
  X509* c = cert->get();
  X509_set_issuer_name(c, X509_get_subject_name(c));
  if (!AddExt(c, c, NID_basic_constraints, "critical,CA:TRUE") ||
      !AddExt(c, c, NID_key_usage, "critical,keyCertSign,cRLSign") ||
      !AddExt(c, c, NID_subject_key_identifier, "hash"))
    return OpenSslError("CA extensions");
  if (!X509_sign(c, key.get(), EVP_sha256())) return OpenSslError("sign CA");
  KeyPair kp;
  auto cp = CertPem(c);
  auto kpem = KeyPem(key.get());
  if (!cp.ok()) return cp.status();
  if (!kpem.ok()) return kpem.status();
  kp.cert_pem = *cp;
  kp.key_pem = *kpem;
  return kp;
}

absl::StatusOr<KeyPair> IssueCert(const KeyPair& ca, const std::string& cn,
                                  const std::vector<std::string>& dns,
                                  const std::vector<std::string>& ips, int days) {
  auto ca_key = LoadKey(ca.key_pem);
  if (!ca_key.ok()) return ca_key.status();
  auto ca_cert = LoadCert(ca.cert_pem);
  if (!ca_cert.ok()) return ca_cert.status();
  PKey key(EVP_EC_gen("P-256"));
  if (!key) return OpenSslError("generate key");
  auto cert = NewCert(key.get(), cn, days);
  if (!cert.ok()) return cert.status();
  X509* c = cert->get();
  X509_set_issuer_name(c, X509_get_subject_name(ca_cert->get()));
  std::vector<std::string> san;
  for (const auto& d : dns) san.push_back("DNS:" + d);
  for (const auto& i : ips) san.push_back("IP:" + i);
  if (!AddExt(c, ca_cert->get(), NID_basic_constraints, "critical,CA:FALSE") ||
      !AddExt(c, ca_cert->get(), NID_key_usage, "critical,digitalSignature,keyEncipherment") ||
      !AddExt(c, ca_cert->get(), NID_ext_key_usage, "serverAuth,clientAuth") ||
      (!san.empty() && !AddExt(c, ca_cert->get(), NID_subject_alt_name, absl::StrJoin(san, ","))))
    return OpenSslError("certificate extensions");
  if (!X509_sign(c, ca_key->get(), EVP_sha256())) return OpenSslError("sign certificate");
  KeyPair kp;
  auto cp = CertPem(c);
  auto kpem = KeyPem(key.get());
  if (!cp.ok()) return cp.status();
  if (!kpem.ok()) return kpem.status();
  kp.cert_pem = *cp;
  kp.key_pem = *kpem;
  return kp;
}

}  // namespace tessera
