#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <fcntl.h>
#include <unistd.h>
#include <time.h>
#include <string.h>
#include <sched.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e6+t.tv_nsec/1e3;}
static int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
static double med(double*v,int n){if(!n)return 0;qsort(v,n,sizeof(double),cmp);return v[n/2];}
int main(int c,char**v){ // dir secs burst fifo
  char p[512]; snprintf(p,512,"%s/lx.probe",v[1]); int secs=atoi(v[2]), burst=atoi(v[3]), fifo=atoi(v[4]);
  if(fifo){struct sched_param sp={.sched_priority=10}; sched_setscheduler(0,SCHED_FIFO,&sp);}
  int fd=open(p,O_RDWR|O_CREAT,0600); char*buf=aligned_alloc(4096,8192); memset(buf,7,8192);
  for(int i=0;i<2048;i++)pwrite(fd,buf,8192,(off_t)i*8192); fsync(fd);
  double lone[1000],busy[20000]; int nl=0,nb=0,blk=0; double end=now()+secs*1e6;
  while(now()<end && nl<1000){
    usleep(burst?1000000:200000);
    for(int b=0;b<(burst?burst:1);b++){ pwrite(fd,buf,8192,(off_t)blk*8192); blk=(blk+1)%2048; double t=now(); fdatasync(fd); double d=now()-t;
      if(b==0)lone[nl++]=d; else if(b>=burst/2 && nb<20000) busy[nb++]=d; }
  }
  unlink(p); printf("lone p50 %.0f (n=%d) busy p50 %.0f (n=%d)\n",med(lone,nl),nl,med(busy,nb),nb); return 0;}
